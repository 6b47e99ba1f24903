// Command bench measures Tally as users run it: it starts the real pieces
// (two Redis shards with a replica each, NATS with JetStream, the
// accountant, one and four edge-checkers, as processes), drives them with its
// own load generator (internal/loadgen), and writes docs/performance.md with
// a latency chart beside it.
//
// Every figure is measured in the same run against two references driven by
// the same generator: a no-op net/http handler (the ceiling of the machine)
// and Tally's own mode exact (one reservation on the primary per request,
// like a synchronous Redis limiter).
//
// Usage:
//
//	bench [-out docs/performance.md] [-short] [-ratelimit PATH]
//	bench noop -listen 127.0.0.1:9000     (the reference handler)
//	bench noop-grpc -listen 127.0.0.1:9001 (the gRPC reference: a rate-limit service that allows everything)
//
// make bench builds the binaries and runs it.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "noop-grpc" {
		fs := flag.NewFlagSet("noop-grpc", flag.ExitOnError)
		listen := fs.String("listen", "127.0.0.1:0", "address")
		_ = fs.Parse(os.Args[2:])
		if err := noopGRPC(*listen); err != nil {
			fmt.Fprintln(os.Stderr, "bench noop-grpc:", err)
			os.Exit(1)
		}
		return
	}
	if len(os.Args) > 1 && os.Args[1] == "render" {
		// bench render REPORT: write REPORT again from its own raw figures
		// with this build's text and targets (its date, machine and
		// figures kept).
		if len(os.Args) != 3 {
			fmt.Fprintln(os.Stderr, "usage: bench render REPORT.md")
			os.Exit(2)
		}
		if err := render(os.Args[2]); err != nil {
			fmt.Fprintln(os.Stderr, "bench render:", err)
			os.Exit(1)
		}
		return
	}
	if len(os.Args) > 1 && os.Args[1] == "noop" {
		fs := flag.NewFlagSet("noop", flag.ExitOnError)
		listen := fs.String("listen", "127.0.0.1:0", "address")
		_ = fs.Parse(os.Args[2:])
		if err := noop(*listen); err != nil {
			fmt.Fprintln(os.Stderr, "bench noop:", err)
			os.Exit(1)
		}
		return
	}
	out := flag.String("out", "docs/performance.md", "the report to write (a chart and the raw JSON go beside it)")
	short := flag.Bool("short", false, "shorter runs (a quick look, noisier figures)")
	bin := flag.String("bin", "bin", "directory of edge-checker, accountant and nats-server")
	keep := flag.Bool("keep", false, "keep the working directory (logs, data) after a successful run")
	only := flag.String("only", "", "run only the steps whose names contain this (e.g. lag); the report is then partial")
	profile := flag.String("profile", "", "write CPU and allocation profiles of the edge-checker (and the load generator) during the saturation, key-count and gRPC door runs, and an execution trace during the open loop over many keys, to this directory")
	ratelimit := flag.String("ratelimit", "", "an envoyproxy/ratelimit binary to measure beside Tally over many keys (the key-count step)")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	b, err := newBench(*bin, *short)
	if err == nil {
		b.profile, b.only, b.ratelimitBin = *profile, *only, *ratelimit
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
	err = b.run(ctx, *out)
	b.stack.StopAll()
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		fmt.Fprintln(os.Stderr, "logs are in", b.stack.Dir)
		os.Exit(1)
	}
	if *keep {
		fmt.Println("logs are in", b.stack.Dir)
		return
	}
	_ = os.RemoveAll(b.stack.Dir)
}

// noop serves the reference: a net/http handler that reads the body and
// answers 200, nothing else.
func noop(listen string) error {
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return err
	}
	srv := &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.WriteHeader(http.StatusOK)
	})}
	go func() {
		sig := make(chan os.Signal, 1)
		signal.Notify(sig, syscall.SIGTERM, os.Interrupt)
		<-sig
		_ = srv.Close()
	}()
	if err := srv.Serve(ln); err != http.ErrServerClosed {
		return err
	}
	return nil
}

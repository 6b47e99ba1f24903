package service

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/tallyhq/tally/internal/servertls"
)

// listeners runs HTTP servers; the first that fails is reported on failed,
// which stops the process with a non-zero status.
type listeners struct {
	log     *slog.Logger
	servers []*http.Server
	failed  chan error
}

func newListeners(log *slog.Logger) *listeners {
	return &listeners{log: log, failed: make(chan error, 8)}
}

// Limits bound what one connection may hold of a listener: header bytes
// and the time to read a request, write a response and stay idle.
type Limits struct {
	MaxHeaderBytes                                            int
	ReadHeaderTimeout, ReadTimeout, WriteTimeout, IdleTimeout time.Duration
}

// adminLimits are an admin listener's: small requests, a /metrics or a
// profile may take a while to write.
var adminLimits = Limits{MaxHeaderBytes: 16 << 10, ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 10 * time.Second,
	WriteTimeout: 2 * time.Minute, IdleTimeout: 2 * time.Minute}

// serve listens on addr (the error comes back at once when it cannot, or
// when tc's files cannot be used) and serves h in the background within
// lim, over TLS when tc is on (its files read again when they change,
// client certificates required when it names a CA).
func (l *listeners) serve(addr string, tc servertls.Config, h http.Handler, lim Limits) (*http.Server, error) {
	files, err := loadTLS(tc, l.log)
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	hs := &http.Server{Handler: h, MaxHeaderBytes: lim.MaxHeaderBytes, ReadHeaderTimeout: lim.ReadHeaderTimeout,
		ReadTimeout: lim.ReadTimeout, WriteTimeout: lim.WriteTimeout, IdleTimeout: lim.IdleTimeout,
		ErrorLog: slog.NewLogLogger(l.log.Handler(), slog.LevelWarn)}
	if files != nil {
		hs.TLSConfig = files.TLSConfig("h2", "http/1.1")
	}
	l.servers = append(l.servers, hs)
	l.log.Info("listening", "addr", ln.Addr().String(), "tls", tc.On(), "client_certificates", tc.ClientCAFile != "")
	go func() {
		serve := hs.Serve
		if files != nil {
			serve = func(ln net.Listener) error { return hs.ServeTLS(ln, "", "") }
		}
		if err := serve(ln); !errors.Is(err, http.ErrServerClosed) {
			l.failed <- err
		}
	}()
	return hs, nil
}

// loadTLS reads a listener's TLS files; nil when its TLS is off.
func loadTLS(tc servertls.Config, log *slog.Logger) (*servertls.Files, error) {
	if !tc.On() {
		return nil, nil
	}
	return servertls.Load(tc, log.With("tls", tc.CertFile))
}

// wait returns when ctx ends (nil) or a listener fails (its error).
func (l *listeners) wait(ctx context.Context) error {
	select {
	case <-ctx.Done():
		return nil
	case err := <-l.failed:
		l.log.Error("listener failed; shutting down", "err", err)
		return err
	}
}

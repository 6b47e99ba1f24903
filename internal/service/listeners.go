package service

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"time"
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

// serve listens on addr (the error comes back at once when it cannot) and
// serves h in the background within lim.
func (l *listeners) serve(addr string, h http.Handler, lim Limits) (*http.Server, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	hs := &http.Server{Handler: h, MaxHeaderBytes: lim.MaxHeaderBytes, ReadHeaderTimeout: lim.ReadHeaderTimeout,
		ReadTimeout: lim.ReadTimeout, WriteTimeout: lim.WriteTimeout, IdleTimeout: lim.IdleTimeout,
		ErrorLog: slog.NewLogLogger(l.log.Handler(), slog.LevelWarn)}
	l.servers = append(l.servers, hs)
	l.log.Info("listening", "addr", ln.Addr().String())
	go func() {
		if err := hs.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			l.failed <- err
		}
	}()
	return hs, nil
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

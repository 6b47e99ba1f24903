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

// serve listens on addr (the error comes back at once when it cannot) and
// serves h in the background.
func (l *listeners) serve(addr string, h http.Handler, maxHeaderBytes int) (*http.Server, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	hs := &http.Server{Handler: h, MaxHeaderBytes: maxHeaderBytes,
		ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute}
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

package service

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/tallyhq/tally/internal/config"
	"github.com/tallyhq/tally/internal/descriptors"
	"github.com/tallyhq/tally/internal/edge"
)

// reload reads the edge's configuration again on SIGHUP and whenever its
// file, or a file of the rate-limit rules' directory, changes (checked
// every interval), until ctx ends. What a running edge can take — its
// policies, routes, tiers and overrides, and the rate-limit rules — takes
// effect at once for the next request, without dropping one in flight, and
// the log says what changed; a change elsewhere is logged as waiting for
// the next start. A configuration that cannot be read or used is refused
// with its reason, and the one in effect stays.
func reload(ctx context.Context, cfg *config.File, srv *edge.Server, interval time.Duration, log *slog.Logger) {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	current := cfg
	seen := watchState(current)
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		why := ""
		select {
		case <-ctx.Done():
			return
		case <-hup:
			why = "SIGHUP"
		case <-t.C:
			if now := watchState(current); now != seen {
				seen, why = now, "a file changed"
			}
		}
		if why == "" {
			continue
		}
		if current.Path() == "" && current.Edge.RLS.Config == "" {
			log.Warn("nothing to reload: the configuration was not read from a file", "why", why)
			continue
		}
		next, changed, err := reloadOnce(current, srv)
		if err != nil {
			log.Error("the configuration was not reloaded; the one in effect stays", "why", why, "err", err)
			continue
		}
		current = next
		seen = watchState(current)
		if rules := next.Descriptors(); rules != nil {
			for _, w := range rules.Warnings {
				log.Warn("rate-limit rules", "warning", w)
			}
		}
		limits, restart := changed.limits, changed.restart
		log.Info("configuration reloaded", "why", why, "changes", len(limits), "changed", strings.Join(limits, "; "))
		if len(restart) > 0 {
			log.Warn("changes that take effect at the next start were not applied", "sections", strings.Join(restart, ", "))
		}
	}
}

type changes struct{ limits, restart []string }

// reloadOnce reads what current was read from again and hands the edge
// what it can take at once.
func reloadOnce(current *config.File, srv *edge.Server) (*config.File, changes, error) {
	if current.Path() == "" {
		// Only the rate-limit rules come from files.
		r := &current.Edge.RLS
		rules, err := descriptors.LoadDir(r.Config, r.RuleOptions())
		if err == nil {
			err = srv.SetDescriptors(rules)
		}
		if err != nil {
			return nil, changes{}, err
		}
		c := changes{limits: descriptors.Diff(current.Descriptors(), rules)}
		next := *current
		next.SetDescriptors(rules)
		return &next, c, nil
	}
	next, err := current.Reload()
	if err != nil {
		return nil, changes{}, err
	}
	if err := srv.SetLimits(next.Limits()); err != nil {
		return nil, changes{}, fmt.Errorf("limits: %w", err)
	}
	var c changes
	c.limits, c.restart = current.Changes(next)
	if rules := next.Descriptors(); rules != nil && next.Edge.RLS.Listen == current.Edge.RLS.Listen && current.Edge.RLS.Listen != "" {
		if err := srv.SetDescriptors(rules); err != nil {
			return nil, changes{}, fmt.Errorf("rate-limit rules: %w", err)
		}
		c.limits = append(c.limits, descriptors.Diff(current.Descriptors(), rules)...)
	}
	return next, c, nil
}

// watchState sums up what a reload reads (names, sizes, times) to notice
// a change.
func watchState(cfg *config.File) string {
	var parts []string
	if p := cfg.Path(); p != "" {
		parts = append(parts, fileState(p))
	}
	if dir := cfg.Edge.RLS.Config; dir != "" {
		entries, err := os.ReadDir(dir)
		if err != nil {
			parts = append(parts, "unreadable: "+err.Error())
		}
		for _, e := range entries {
			parts = append(parts, fileState(filepath.Join(dir, e.Name())))
		}
	}
	sort.Strings(parts)
	return strings.Join(parts, "|")
}

func fileState(path string) string {
	info, err := os.Stat(path)
	if err != nil {
		return path + ": " + err.Error()
	}
	return fmt.Sprintf("%s:%d:%d", path, info.Size(), info.ModTime().UnixNano())
}

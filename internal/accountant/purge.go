package accountant

import (
	"context"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// purge deletes from the stream what is applied (or dead-lettered), once a
// replica has confirmed it, at most every PurgeEvery, in the background so
// that reading goes on meanwhile (the final purge waits). The confirmation
// is a renewal of the lease with a WAIT: replication keeps order, so it
// covers every event applied before it.
func (w *worker) purge(final bool) {
	if final {
		// The last purge also waits for one still in flight: it holds the
		// lease while it confirms, and must not take it back after the
		// shard's lease is freed.
		defer w.purging.Wait()
	}
	upTo := w.applied
	if (upTo <= w.purged && !w.purgeFailed.Load()) || upTo == 0 || (!final && time.Since(w.lastPurge) < w.a.cfg.PurgeEvery) {
		return
	}
	w.purging.Wait() // one at a time
	w.purgeFailed.Store(false)
	w.purged, w.lastPurge = upTo, time.Now()
	w.purging.Go(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		l, err := w.a.store.ConfirmApplied(ctx, w.shard, w.a.cfg.Owner, w.a.cfg.LeaseTTL)
		if err == nil && w.reseeded() {
			// Confirmed on a primary that is not the one the events were
			// applied on: they are applied again first.
			w.purgeFailed.Store(true)
			return
		}
		if err != nil || l.Replicated < l.Waited {
			w.purgeFailed.Store(true)
			w.a.unconfirmed.Add(1)
			w.a.log.Warn("no replica confirmed applied events in time; they stay in the stream until one does",
				"shard", w.name, "waited_for", l.Waited, "replicated", l.Replicated, "err", err)
			return
		}
		if err := w.stream.Purge(ctx, jetstream.WithPurgeSubject(w.subject), jetstream.WithPurgeSequence(upTo+1)); err != nil {
			w.purgeFailed.Store(true)
			w.a.log.Warn("deleting applied events from the stream failed; will retry", "shard", w.name, "err", err)
		}
	})
}

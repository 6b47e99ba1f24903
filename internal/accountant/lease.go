package accountant

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/tallyhq/tally/internal/redisstore"
)

// serveShard holds shard i's lease and reads its events while it holds it,
// until ctx ends.
func (a *Accountant) serveShard(ctx context.Context, i int) {
	name := a.store.ShardName(i)
	poll := a.cfg.LeaseTTL / 4
	delay := a.cfg.RetryMin
	// again is the pause before reading the shard again after its reading
	// failed: doubling while it fails at once (JetStream without a quorum,
	// a stream gone), back to RetryMin after a reading that lasted.
	again := a.cfg.RetryMin
	defer func() {
		free, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		defer cancel()
		_ = a.store.FreeLease(free, i, a.cfg.Owner)
	}()
	for ctx.Err() == nil {
		held, err := a.hold(ctx, i)
		switch {
		case errors.Is(err, redisstore.ErrReseeding):
			// The shard's primary changed: the lease (and applying) waits
			// for the reseed's end, which is near.
			a.setState(i, false, err)
			sleep(ctx, a.cfg.RetryMin)
			continue
		case err != nil:
			a.setState(i, false, err)
			a.log.Warn("shard lease unavailable; retrying", "shard", name, "err", err)
			sleep(ctx, delay)
			delay = min(2*delay, a.cfg.RetryMax)
			continue
		case !held: // another accountant serves the shard
			a.setState(i, false, nil)
			sleep(ctx, poll)
			continue
		}
		delay = a.cfg.RetryMin
		a.setState(i, true, nil)
		a.log.Info("serving shard", "shard", name, "owner", a.cfg.Owner)
		began := time.Now()
		err = a.lead(ctx, i)
		if errors.Is(err, errReseeded) {
			a.log.Info("the shard's primary changed: reading its events again from the oldest", "shard", name)
			a.setState(i, false, nil)
			continue
		}
		a.setState(i, false, err)
		if err != nil && ctx.Err() == nil {
			if time.Since(began) > a.cfg.RetryMax {
				again = a.cfg.RetryMin
			}
			a.log.Error("shard stopped; restarting it", "shard", name, "err", err, "retry_in", again)
			sleep(ctx, again)
			again = min(2*again, a.cfg.RetryMax)
		}
	}
}

func (a *Accountant) hold(ctx context.Context, i int) (bool, error) {
	c, cancel := context.WithTimeout(ctx, a.cfg.LeaseTTL/2)
	defer cancel()
	l, err := a.store.HoldLease(c, i, a.cfg.Owner, a.cfg.LeaseTTL)
	return l.Held, err
}

// lead reads shard i while this process holds its lease: a renewal loop
// ends the reading as soon as the lease is lost or cannot be renewed in
// time.
func (a *Accountant) lead(ctx context.Context, i int) error {
	leading, lost := context.WithCancelCause(ctx)
	defer lost(nil)
	renewed := make(chan struct{})
	go func() {
		defer close(renewed)
		last := time.Now()
		t := time.NewTicker(a.cfg.LeaseTTL / 3)
		defer t.Stop()
		for {
			select {
			case <-leading.Done():
				return
			case <-t.C:
			}
			held, err := a.hold(leading, i)
			switch {
			case err == nil && held:
				last = time.Now()
			case err == nil:
				lost(errors.New("lease taken by another accountant"))
				return
			case time.Since(last) > a.cfg.LeaseTTL*2/3:
				lost(fmt.Errorf("lease not renewed: %w", err))
				return
			}
		}
	}()
	err := a.consume(leading, i)
	lost(nil)
	<-renewed
	if cause := context.Cause(leading); err == nil && ctx.Err() == nil && cause != nil && !errors.Is(cause, context.Canceled) {
		a.log.Warn("shard handed over", "shard", a.store.ShardName(i), "reason", cause)
	}
	return err
}

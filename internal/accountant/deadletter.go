package accountant

import (
	"context"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tallyhq/tally/internal/events"
)

// Dead-letter headers, added to a copy of the original message.
const (
	HeaderDeadReason  = "Tally-Dead-Letter-Reason"
	HeaderDeadSubject = "Tally-Original-Subject"
	HeaderDeadSeq     = "Tally-Original-Sequence"
)

// deadLetter copies a message to the dead-letter stream with the reason,
// retrying until it is stored or ctx ends (reporting false): a message is
// never dropped without a trace.
func (w *worker) deadLetter(ctx context.Context, it *item) bool {
	a := w.a
	dm := nats.NewMsg(a.cfg.Streams.DeadLetters.SubjectPrefix + "." + w.name)
	dm.Header = nats.Header{}
	for k, v := range it.msg.Headers() {
		if k != events.HeaderMsgID {
			dm.Header[k] = append([]string(nil), v...)
		}
	}
	seq := strconv.FormatUint(it.seq, 10)
	dm.Header[HeaderDeadSeq] = []string{seq}
	dm.Header[HeaderDeadReason] = []string{clip(it.bad.Error(), 1000)}
	dm.Header[HeaderDeadSubject] = []string{it.msg.Subject()}
	dm.Data = it.msg.Data()
	if len(it.refused) > 0 {
		// Only what Redis refused: the message's other events were applied.
		if m, err := events.AccountingMsg(a.cfg.Streams.Accounting.SubjectPrefix, w.name, it.refused, nil); err == nil {
			dm.Data = m.Data
		}
	}
	for delay := a.cfg.RetryMin; ; delay = min(2*delay, a.cfg.RetryMax) {
		call, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		_, err := a.js.PublishMsg(call, dm, jetstream.WithMsgID("dead."+w.name+"."+seq))
		cancel()
		if err == nil {
			a.dead.Add(1)
			a.log.Warn("message dead-lettered", "shard", w.name, "seq", it.seq, "reason", it.bad)
			return true
		}
		a.log.Error("dead-letter publish failed; retrying", "shard", w.name, "err", err)
		if !sleep(ctx, delay) {
			return false
		}
	}
}

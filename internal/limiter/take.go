package limiter

import (
	"fmt"
	"strings"
	"time"
)

// TakeArgs say what Take reserves.
type TakeArgs struct {
	// Window and Limit are the policy's terms.
	Window time.Duration
	Limit  int64
	// Need is the least worth reserving (the request's cost, less the credit
	// the caller already holds): nothing is reserved unless at least Need is
	// left. Want (Need to Limit) is the most to reserve. Need and Want both
	// 0 only read the window: nothing is opened or written.
	Need, Want int64
	// Producer is the caller's producer id (ValidProducer); Grant.Applied is
	// the highest of its event sequences the shard's primary has applied.
	Producer string
	// Holder names who the units are reserved for (1 to MaxHolderLen of
	// [A-Za-z0-9_.-]: the producer, or the producer, a dot and more; default
	// the producer); the window counts every unit ever reserved for it
	// (Grant.Mine). What is reserved counts as the producer's in the window:
	// its releases and refunds give back at most that.
	Holder string
	// Owed are the caller's charges of this window sent as accounting
	// events (mode async's admissions over credit) that may not be applied
	// yet, at most MaxOwed: those the primary has not applied count as
	// used, so that a reservation never takes room the caller already
	// admitted requests into.
	Owed []Owed
	// Freeze, when set, records in the same call the part of what is
	// reserved the caller will not spend yet (lua/hold.lua's share): all of
	// it but Keep units, added to the share when the window holds exactly
	// Share for the holder, until ShareExpiry (Grant.Frozen).
	Freeze      bool
	Keep, Share int64
	ShareExpiry time.Time
	// Fresh says the caller knows of no window of the key (its first
	// reservation of it): where windows may be compact, the store first
	// tries to open one with a single SET ... NX, and makes the whole
	// reservation when a window is there after all. For a token bucket
	// (Rate above 0), Fresh says the caller reserved in none of the
	// bucket's periods near now (none in the last four): the store first
	// sends lua/bucket.lua, which reserves when Redis holds none of them
	// either, and the whole reservation when it does.
	Fresh bool
	// Own says the caller's last reservation found the window its holder's
	// own compact one (Grant.Own): where it may still be, the store first
	// sends the short script of that case (lua/own.lua), and the whole
	// reservation only when the window is something else by now. For a
	// sliding window's sub-window, it says the last reservation left the
	// window's span record true (lua/slide.lua): the store first sends the
	// record alone. For a token bucket, that the last reservation left its
	// period the holder's own compact one (lua/bucket.lua, whatever the
	// period since): the store first sends lua/bucket.lua, as for Fresh.
	Own bool
	// Align opens a window aligned to the clock (Policy.Align) when none is
	// live.
	Align bool
	// Opens is the window the take opens when none is live: the policy's
	// Policy.WindowAt(now), for now the time of the take. It must hold now;
	// its length is the window's, whatever Window says (a calendar
	// policy's windows differ in length). Zero: WindowAt of a policy of
	// Window and Align.
	Opens Span
	// Slices, when above 0, makes the take one in a sliding window of
	// that many sub-windows of Window (Policy.Slices): it reserves in the
	// sub-window Opens names (Key.SliceKey), at most what leaves every
	// span of Slices sub-windows that holds it within Limit, and
	// Grant.Used is the fullest of those spans. Freeze does not apply,
	// nor Fresh but to a token bucket (below).
	Slices int
	// Rate and Every, when Rate is above 0, make the take one in a token
	// bucket (Policy.Rate, Policy.Every; Slices 2, Window BucketPeriod):
	// besides the units held in its periods, the bucket counts what was
	// spent and has not refilled yet (Key.BucketKey), and Grant.Used holds
	// both.
	Rate  int64
	Every time.Duration
	// Spent, for a token bucket, says the caller spends what it is granted
	// at once (mode exact): the units count as spent when granted, not as
	// held until the period after theirs ends.
	Spent bool
}

// Owed is one charge an edge sent as an accounting event: its sequence and
// units.
type Owed struct {
	Seq   uint64
	Units int64
}

// MaxOwed bounds TakeArgs.Owed.
const MaxOwed = 64

// MaxHolderLen bounds TakeArgs.Holder.
const MaxHolderLen = 100

// Grant is what Take reserved, and the window after it.
type Grant struct {
	// Granted is the units reserved: 0, or from Need to Want.
	Granted int64
	// Live is false only for a read (Need 0) that found no live window; the
	// fields below are then zero.
	Live bool
	// Used is the window's count after the call, every edge's reservations
	// included.
	Used           int64
	ResetAt, Start time.Time
	// Opened reports that this call opened the window.
	Opened bool
	// Applied is the highest n such that every event 1..n of the producer
	// has been applied on this shard (below the oldest number still
	// missing, when a later batch was applied first). It is read only when
	// TakeArgs.Owed is not empty (0 otherwise): only debts need it.
	Applied uint64
	// Mine is every unit reserved for the holder in this window so far,
	// this call's included: more than the holder knows it was given means
	// a reservation whose answer it never got was made after all.
	Mine int64
	// Frozen is the holder's share after the call when TakeArgs.Freeze was
	// set and the window held TakeArgs.Share; -1 otherwise (nothing frozen).
	Frozen int64
	// Own reports that the window is, after the call, the holder's own
	// compact one, and for a sliding window's sub-window that its span
	// record holds (TakeArgs.Own).
	Own bool
	// Shard is the shard that holds the window (the Reserver's numbering):
	// the key's owner, or, while shards are added or removed, its previous
	// owner until the window there resets.
	Shard int
}

func (a TakeArgs) Validate(k Key) error {
	switch {
	case k.IsZero():
		return fmt.Errorf("%w: take: no key", ErrInvalidArgument)
	case a.Limit < 1 || a.Limit > MaxLimit:
		return fmt.Errorf("%w: take: limit %d", ErrInvalidArgument, a.Limit)
	case a.Need < 0 || a.Need > a.Limit || a.Want < a.Need || a.Want > a.Limit || (a.Need == 0) != (a.Want == 0):
		return fmt.Errorf("%w: take: need %d, want %d: want 1 <= need <= want <= limit, or both 0", ErrInvalidArgument, a.Need, a.Want)
	case !ValidProducer(a.Producer):
		return fmt.Errorf("%w: take: producer %q", ErrInvalidArgument, truncate(a.Producer, 70))
	case len(a.Owed) > MaxOwed:
		return fmt.Errorf("%w: take: %d owed charges: at most %d", ErrInvalidArgument, len(a.Owed), MaxOwed)
	case a.Holder != "" && (!validID(a.Holder, MaxHolderLen) || (a.Holder != a.Producer && !heldBy(a.Holder, a.Producer))):
		return fmt.Errorf("%w: take: holder %q of producer %q", ErrInvalidArgument, truncate(a.Holder, 70), a.Producer)
	case a.Freeze && (a.Keep < 0 || a.Keep > MaxLimit || a.Share < 0 || a.Share > MaxLimit):
		return fmt.Errorf("%w: take: keep %d, share %d", ErrInvalidArgument, a.Keep, a.Share)
	}
	for _, o := range a.Owed {
		if o.Seq < 1 || o.Seq > MaxSeq || o.Units < 1 || o.Units > MaxLimit {
			return fmt.Errorf("%w: take: owed %d units of event %d", ErrInvalidArgument, o.Units, o.Seq)
		}
	}
	if err := validSlices(a.Window, a.Slices); err != nil {
		return fmt.Errorf("take: %w", err)
	}
	if a.Rate != 0 && (a.Rate < 0 || a.Rate > MaxLimit || a.Slices != 2 || a.Window != BucketPeriod || a.Every < time.Second ||
		a.Every > MaxBucketEvery || a.Every%time.Second != 0 || a.Limit*a.Every.Milliseconds() > MaxBucketScale) {
		return fmt.Errorf("%w: take: a bucket of %d refilled %d every %v in %d periods of %v", ErrInvalidArgument, a.Limit, a.Rate, a.Every,
			a.Slices, a.Window)
	}
	if a.Slices > 0 && (a.Opens.IsZero() || a.Opens.Length() != a.Window || !a.Align) {
		return fmt.Errorf("%w: take: a sliding window's take names its sub-window, aligned, %v long", ErrInvalidArgument, a.Window)
	}
	if !a.Opens.IsZero() {
		if err := a.Opens.validate(); err != nil {
			return fmt.Errorf("take: %w", err)
		}
	}
	return validWindow(a.Window)
}

// OpensAt is the window a take at now opens when none is live: Opens, or
// the window of a policy of Window and Align. It reports an error, wrapping
// ErrInvalidArgument, when that window does not hold now.
func (a TakeArgs) OpensAt(now time.Time) (Span, error) {
	s := a.Opens
	if s.IsZero() {
		s = Policy{Window: a.Window, Align: a.Align}.WindowAt(now)
	}
	if !s.Contains(now) {
		return Span{}, fmt.Errorf("%w: take: window %v to %v does not hold now, %v", ErrInvalidArgument, s.Start, s.ResetAt, now)
	}
	return s, nil
}

// validSlices refuses a sliding window the scripts would refuse: 0 (none),
// or 2 to MaxSlices sub-windows of whole seconds spanning at most
// MaxWindow.
func validSlices(window time.Duration, slices int) error {
	if slices == 0 {
		return nil
	}
	if slices < 2 || slices > MaxSlices || window%time.Second != 0 || time.Duration(slices)*window > MaxWindow {
		return fmt.Errorf("%w: %d sub-windows of %v: want 2 to %d, whole seconds, spanning at most %v", ErrInvalidArgument,
			slices, window, MaxSlices, MaxWindow)
	}
	return nil
}

// validate refuses a window the scripts would refuse: whole seconds, from
// MinWindow to MaxSpan long.
func (s Span) validate() error {
	if s.Start.UnixMilli()%1000 != 0 || s.ResetAt.UnixMilli()%1000 != 0 || s.Start.UnixMilli() < 0 || s.ResetAt.UnixMilli() > MaxMS {
		return fmt.Errorf("%w: window %v to %v: want whole seconds", ErrInvalidArgument, s.Start, s.ResetAt)
	}
	return validWindow(s.Length())
}

// Hold reports the share of a holder's credit in a window that it will not
// spend until a later Hold lowers it (lua/hold.lua): once Expiry has passed
// unreported, a reservation short of room takes the share back.
type Hold struct {
	Key      Key
	ResetAt  time.Time // the window
	Holder   string
	Producer string
	// Expected is the share the holder last saw recorded (0: none); the
	// call changes nothing unless the window holds exactly that.
	Expected int64
	// Frozen is the share from now; Expiry when it may be taken back.
	Frozen int64
	Expiry time.Time
}

// HoldOutcome is what a Hold did.
type HoldOutcome int

const (
	// Held: the share is now Frozen.
	Held HoldOutcome = iota
	// HoldMismatch: the window holds HoldResult.Have for the holder, not
	// Expected (a share taken back, or a report whose answer was lost);
	// nothing changed.
	HoldMismatch
	// HoldGone: the window reset (or is another); nothing changed.
	HoldGone
)

// HoldResult is the answer to one Hold.
type HoldResult struct {
	Outcome HoldOutcome
	Have    int64
}

// Claim is what one holder (an edge's table entry) re-asserts in one live
// window during a reseed, after the window's primary changed or came back
// empty (lua/reseed.lua): what it was given there, and the accounting
// events its producer sent for the window. The primary that took over
// keeps the larger of what it holds and the claim; a window it does not
// hold is opened as the claim says, with the producer's whole part.
type Claim struct {
	Key            Key
	Window         time.Duration
	ResetAt, Start time.Time
	Holder         string
	Producer       string
	// Reserved is every unit reserved for the holder in the window.
	Reserved int64
	// Charged and GivenBack are the units of the producer's charge events,
	// and of its refund and release events, for this window numbered From <
	// seq <= To: a window the reseed opens counts them, and takes those events
	// as applied.
	Charged, GivenBack int64
	From, To           uint64
	// Frozen is the holder's share as it last had it recorded (0: none),
	// until FrozenExpiry.
	Frozen       int64
	FrozenExpiry time.Time
	// Slices, above 0, makes the window a sub-window of a sliding window
	// of that many (TakeArgs.Slices): it is claimed under its own key
	// (Key.SliceKey) while it is in a span, until Linger after its reset.
	Slices int
}

// Validate refuses a claim reseed.lua would refuse.
func (c Claim) Validate() error {
	const most = 999_999_999_999_999
	switch {
	case c.Key.IsZero():
		return fmt.Errorf("%w: claim: no key", ErrInvalidArgument)
	case !ValidProducer(c.Producer):
		return fmt.Errorf("%w: claim: producer %q", ErrInvalidArgument, truncate(c.Producer, 70))
	case !validID(c.Holder, MaxHolderLen) || (c.Holder != c.Producer && !strings.HasPrefix(c.Holder, c.Producer+".")):
		return fmt.Errorf("%w: claim: holder %q of producer %q", ErrInvalidArgument, truncate(c.Holder, 70), c.Producer)
	case c.ResetAt.UnixMilli()%1000 != 0 || !c.Start.Before(c.ResetAt) || c.ResetAt.After(c.Start.Add(c.Window+61*time.Second)):
		return fmt.Errorf("%w: claim: window %v to %v", ErrInvalidArgument, c.Start, c.ResetAt)
	case c.Reserved < 0 || c.Reserved > most || c.Charged < 0 || c.Charged > most || c.GivenBack < 0 || c.GivenBack > most:
		return fmt.Errorf("%w: claim: units %d, %d, %d", ErrInvalidArgument, c.Reserved, c.Charged, c.GivenBack)
	case c.To < c.From || c.To > MaxSeq:
		return fmt.Errorf("%w: claim: events %d to %d", ErrInvalidArgument, c.From, c.To)
	case c.Frozen < 0 || c.Frozen > MaxLimit || (c.Frozen > 0 && c.FrozenExpiry.Before(time.UnixMilli(0))):
		return fmt.Errorf("%w: claim: frozen %d", ErrInvalidArgument, c.Frozen)
	}
	if err := validSlices(c.Window, c.Slices); err != nil {
		return fmt.Errorf("claim: %w", err)
	}
	return validWindow(c.Window)
}

// heldBy reports whether holder is one of producer's, "<producer>.<n>",
// without building the prefix (Validate runs on every take).
func heldBy(holder, producer string) bool {
	return len(holder) > len(producer) && holder[len(producer)] == '.' && strings.HasPrefix(holder, producer)
}

package descriptors

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/tallyhq/tally/internal/limiter"
)

// ErrInvalid is wrapped by every error of a file that cannot be used.
var ErrInvalid = errors.New("descriptors: invalid")

// Unit is a rate limit's unit of time, as envoyproxy/ratelimit's YAML and
// Envoy's RateLimitResponse name them.
type Unit string

// The units, and their lengths in envoyproxy/ratelimit (a month is 30 days,
// a year 365).
const (
	Second Unit = "SECOND"
	Minute Unit = "MINUTE"
	Hour   Unit = "HOUR"
	Day    Unit = "DAY"
	Week   Unit = "WEEK"
	Month  Unit = "MONTH"
	Year   Unit = "YEAR"
)

var unitLength = map[Unit]time.Duration{
	Second: time.Second,
	Minute: time.Minute,
	Hour:   time.Hour,
	Day:    24 * time.Hour,
	Week:   7 * 24 * time.Hour,
	Month:  30 * 24 * time.Hour,
	Year:   365 * 24 * time.Hour,
}

// PolicyPrefix begins the name of every rule's policy (the edge names a
// rule's policy after its full key): it keeps rules' windows apart from
// configured policies'.
const PolicyPrefix = "rls."

// RuleWindow reports whether a window of length d can be a rule's: a
// unit's length, or (the calendar extension) the length of a calendar
// day, week, month or year in some time zone. What an accountant that
// does not load the rules (they may come by xDS) accepts of a rule's
// events.
// A sliding rule's events name its sub-windows: slices of them make a
// unit's length (slices 0: a window); a concurrency rule's, two
// sub-windows of a unit each; a token bucket rule's, two periods of a
// second (limiter.BucketPeriod, a unit too).
func RuleWindow(d time.Duration, slices int) bool {
	for u, l := range unitLength {
		if d*time.Duration(max(1, slices)) == l || (slices == 2 && d == l) || (slices == 0 && u.Period() != "" && u.Period().Fits(d)) {
			return true
		}
	}
	return false
}

// Duration is the unit's length; 0 for an unknown unit.
func (u Unit) Duration() time.Duration { return unitLength[u] }

// Rule is a descriptor with a rate_limit.
type Rule struct {
	// Domain is the file's domain; Key the rule's full key as
	// envoyproxy/ratelimit names it (its stats, its logs): the domain and
	// each level's key, or key_value, joined by dots
	// ("mongo_cps.database_users").
	Domain, Key string
	// Name is rate_limit.name (optional): what other rules' replaces name.
	Name string
	// Limit is requests_per_unit per Unit; 0 (written or left out) denies
	// every request. Unlimited rules have neither.
	Limit     int64
	Unit      Unit
	Unlimited bool
	// Shadow is shadow_mode: decide and record, never deny.
	Shadow bool
	// Quota is quota_mode: the request is denied by such rules only when
	// every one of them that applies is over its limit.
	Quota bool
	// Replaces names the rules this one takes the place of when both apply
	// to a request.
	Replaces []string
	// Calendar is Tally's extension rate_limit.calendar: each window is the
	// calendar day, ISO week (from Monday), month or year (Unit) of
	// Location, from local midnight to local midnight, rather than the
	// reference's length of Unit. Location is UTC for calendar: {}; nil when
	// Calendar is false.
	Calendar bool
	Location *time.Location
	// Slices, above 0, is Tally's extension rate_limit.sliding: the rule
	// admits requests_per_unit in any Slices consecutive sub-windows of
	// its unit, aligned to the clock (limiter.SlidingWindow); 0 for a
	// fixed window.
	Slices int
	// Concurrency is Tally's extension rate_limit.concurrency: the rule
	// holds requests_per_unit requests in flight at once, each from its
	// start until Envoy's call at its stream's end finishes it, or for a
	// lease of one to two units (limiter.Concurrency).
	Concurrency bool
	// Burst, above 0, is Tally's extension rate_limit.token_bucket: the
	// rule is a token bucket of Burst refilled requests_per_unit every
	// unit (limiter.TokenBucket); 0 for a window.
	Burst int64
	// File and Line say where the rule is written.
	File string
	Line int
}

// Window is the rule's window length: its unit's, as the reference counts
// it. A calendar rule's windows are periods of the calendar instead, of
// lengths that differ (a month of 28 to 31 days).
func (r *Rule) Window() time.Duration { return r.Unit.Duration() }

// Period is the calendar period a calendar rule of unit u counts in: a
// day, an ISO week, a month or a year; "" for the units a calendar rule
// may not have.
func (u Unit) Period() limiter.Period {
	switch u {
	case Day:
		return limiter.Day
	case Week:
		return limiter.Week
	case Month:
		return limiter.Month
	case Year:
		return limiter.Year
	}
	return ""
}

// Config is every domain's descriptor tree. It is read-only once built and
// safe for concurrent use.
type Config struct {
	domains map[string]*node
	rules   []*Rule
	// Warnings are what the files say that has no effect (a known key where
	// it means nothing), with file and line; envoyproxy/ratelimit ignores
	// them too.
	Warnings []string
}

type node struct {
	children  map[string]*node
	wildcards []wildcard // the children whose key holds a *, in file order
	rule      *Rule
	// share (share_threshold) makes the values this wildcard child matches
	// count together, under pattern (its value part).
	share   bool
	pattern string
}

type wildcard struct {
	key   string   // the child's key_value (or key) as written
	parts []string // key split at each *
}

// Rules lists every rule, in the order of the files and within each.
func (c *Config) Rules() []*Rule { return c.rules }

// Domains lists the domains, sorted.
func (c *Config) Domains() []string {
	out := make([]string, 0, len(c.domains))
	for d := range c.domains {
		out = append(out, d)
	}
	sort.Strings(out)
	return out
}

// Options change how files are put together.
type Options struct {
	// MergeDomains lets several files add to one domain (envoyproxy/
	// ratelimit's MERGE_DOMAIN_CONFIG); otherwise a domain written twice is
	// refused.
	MergeDomains bool
	// Shadow and Quota put every rule in shadow_mode, or quota_mode, as
	// envoyproxy/ratelimit's SHADOW_MODE and QUOTA_MODE do.
	Shadow, Quota bool
}

// LoadDir reads every file of dir, as envoyproxy/ratelimit reads its
// runtime's config directory: each regular file whose name does not start
// with a dot, in name order.
func LoadDir(dir string, o Options) (*Config, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	var files []File
	for _, e := range entries {
		if !e.Type().IsRegular() || strings.HasPrefix(e.Name(), ".") {
			continue
		}
		path := filepath.Join(dir, e.Name())
		data, err := os.ReadFile(path)
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrInvalid, err)
		}
		files = append(files, File{Name: path, Data: data})
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("%w: %s has no configuration files", ErrInvalid, dir)
	}
	return Load(files, o)
}

// File is one configuration file's name (for errors) and content.
type File struct {
	Name string
	Data []byte
}

// Load builds a Config from files, in order. The first error found is
// returned with its file and line.
func Load(files []File, o Options) (*Config, error) {
	c := &Config{domains: map[string]*node{}}
	for _, f := range files {
		root, warnings, err := parse(f.Name, f.Data)
		if err != nil {
			return nil, err
		}
		c.Warnings = append(c.Warnings, warnings...)
		d, ok := c.domains[root.domain]
		if ok && !o.MergeDomains {
			return nil, invalid(f.Name, root.line, "duplicate domain %q in config file", root.domain)
		}
		if !ok {
			d = newNode()
			c.domains[root.domain] = d
		}
		if err := c.add(f.Name, root.domain, d, root.domain+".", root.descriptors); err != nil {
			return nil, err
		}
	}
	for _, r := range c.rules {
		r.Shadow = r.Shadow || o.Shadow
		r.Quota = r.Quota || o.Quota
	}
	return c, nil
}

func newNode() *node { return &node{children: map[string]*node{}} }

// add puts descriptors under n, as envoyproxy/ratelimit's loadDescriptors
// does, refusing what it refuses.
func (c *Config) add(file, domain string, n *node, parent string, ds []yDescriptor) error {
	for _, d := range ds {
		if d.key == "" {
			return invalid(file, d.line, "descriptor has empty key")
		}
		k := d.key
		if d.value != "" {
			k += "_" + d.value
		}
		full := parent + k
		if _, dup := n.children[k]; dup {
			return invalid(file, d.line, "duplicate descriptor composite key '%s'", full)
		}
		child := newNode()
		if rl := d.rateLimit; rl != nil {
			r := &Rule{Domain: domain, Key: full, Name: rl.name, Limit: rl.requestsPerUnit, Unlimited: rl.unlimited,
				Shadow: d.shadow, Quota: d.quota, Replaces: rl.replaces, File: file, Line: rl.line}
			u := Unit(strings.ToUpper(rl.unit))
			valid := u.Duration() > 0
			switch {
			case rl.unlimited && valid:
				return invalid(file, rl.line, "should not specify rate limit unit when unlimited")
			case !rl.unlimited && !valid:
				return invalid(file, rl.line, "invalid rate limit unit '%s'", rl.unit)
			}
			if !rl.unlimited {
				r.Unit = u
			}
			if cal := rl.calendar; cal != nil {
				loc, err := calendarZone(file, cal)
				switch {
				case err != nil:
					return err
				case rl.unlimited:
					return invalid(file, cal.line, "calendar: an unlimited rule has no windows")
				case u.Period() == "":
					return invalid(file, cal.line, "calendar: unit '%s': a calendar window is a day, week, month or year", rl.unit)
				}
				r.Calendar, r.Location = true, loc
			}
			if sl := rl.sliding; sl != nil {
				n := int(sl.slices)
				if sl.slices == 0 {
					n = limiter.DefaultSlices
				}
				switch {
				case rl.unlimited:
					return invalid(file, sl.line, "sliding: an unlimited rule has no windows")
				case rl.calendar != nil:
					return invalid(file, sl.line, "sliding: a sliding window is aligned to the clock, not to a calendar")
				case n < 2 || n > limiter.MaxSlices:
					return invalid(file, sl.line, "sliding.slices %d: want 2 to %d", n, limiter.MaxSlices)
				case u.Duration()%(time.Duration(n)*time.Second) != 0:
					return invalid(file, sl.line, "sliding.slices %d: a %s does not divide into %d whole seconds", n, strings.ToLower(rl.unit), n)
				}
				r.Slices = n
			}
			if line := rl.concurrency; line != 0 {
				switch {
				case rl.unlimited:
					return invalid(file, line, "concurrency: an unlimited rule holds nothing")
				case rl.calendar != nil || rl.sliding != nil:
					return invalid(file, line, "concurrency: a concurrency rule has no windows: leave calendar and sliding out")
				case 2*u.Duration() > limiter.MaxWindow:
					return invalid(file, line, "concurrency: unit '%s': a lease is one unit, at most %d days", rl.unit, limiter.MaxWindow/2/(24*time.Hour))
				}
				r.Concurrency = true
			}
			if b := rl.bucket; b != nil {
				switch {
				case rl.unlimited:
					return invalid(file, b.line, "token_bucket: an unlimited rule has no bucket")
				case rl.calendar != nil || rl.sliding != nil || rl.concurrency != 0:
					return invalid(file, b.line, "token_bucket: a bucket refills continuously: leave calendar, sliding and concurrency out")
				case u.Duration() > limiter.MaxBucketEvery:
					return invalid(file, b.line, "token_bucket: unit '%s': a bucket refills requests_per_unit every second, minute or hour", rl.unit)
				}
				r.Burst = b.burst
				if r.Burst == 0 {
					r.Burst = r.Limit
				}
			}
			for _, name := range rl.replaces {
				if name == "" {
					return invalid(file, rl.line, "should not have an empty replaces entry")
				}
				if name == rl.name {
					return invalid(file, rl.line, "replaces should not contain name of same descriptor")
				}
			}
			child.rule = r
			c.rules = append(c.rules, r)
		}
		hasStar := strings.Contains(k, "*")
		if d.share && !hasStar {
			return invalid(file, d.line, "share_threshold can only be used with wildcard values (containing '*'), but found key '%s'", k)
		}
		if hasStar {
			n.wildcards = append(n.wildcards, wildcard{key: k, parts: strings.Split(k, "*")})
			if d.share {
				child.share, child.pattern = true, k
			}
		}
		if err := c.add(file, domain, child, full+".", d.descriptors); err != nil {
			return err
		}
		n.children[k] = child
	}
	return nil
}

// calendarZone loads a calendar's time zone: an IANA name, UTC when none
// is written (limiter.LoadZone).
func calendarZone(file string, c *yCalendar) (*time.Location, error) {
	loc, err := limiter.LoadZone(c.zone)
	if err != nil {
		return nil, invalid(file, c.zoneLine, "calendar.time_zone: %v", err)
	}
	return loc, nil
}

func invalid(file string, line int, format string, args ...any) error {
	return fmt.Errorf("%w: %s:%d: %s", ErrInvalid, file, line, fmt.Sprintf(format, args...))
}

// Diff says how the rules of next differ from those of prev, a line per
// rule added, removed or changed, by full key ("added mongo_cps.database_users:
// 500/SECOND").
func Diff(prev, next *Config) []string {
	index := func(c *Config) map[string]*Rule {
		m := map[string]*Rule{}
		if c != nil {
			for _, r := range c.rules {
				m[r.Key] = r
			}
		}
		return m
	}
	a, b := index(prev), index(next)
	var out []string
	for _, r := range next.Rules() {
		old, ok := a[r.Key]
		switch {
		case !ok:
			out = append(out, "added "+r.Key+": "+r.terms())
		case old.terms() != r.terms():
			out = append(out, "changed "+r.Key+": "+old.terms()+" → "+r.terms())
		}
	}
	if prev != nil {
		for _, r := range prev.rules {
			if _, ok := b[r.Key]; !ok {
				out = append(out, "removed "+r.Key)
			}
		}
	}
	return out
}

// terms are what a rule does, for Diff.
func (r *Rule) terms() string {
	var s string
	if r.Unlimited {
		s = "unlimited"
	} else {
		s = fmt.Sprintf("%d/%s", r.Limit, r.Unit)
	}
	if r.Shadow {
		s += " shadow"
	}
	if r.Quota {
		s += " quota"
	}
	if r.Name != "" {
		s += " name=" + r.Name
	}
	if len(r.Replaces) > 0 {
		s += " replaces=" + strings.Join(r.Replaces, ",")
	}
	if r.Calendar {
		s += " calendar=" + r.Location.String()
	}
	if r.Slices > 0 {
		s += " sliding=" + strconv.Itoa(r.Slices)
	}
	if r.Concurrency {
		s += " concurrency"
	}
	if r.Burst > 0 {
		s += " token_bucket burst=" + strconv.FormatInt(r.Burst, 10)
	}
	return s
}

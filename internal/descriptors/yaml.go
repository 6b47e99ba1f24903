package descriptors

import (
	"fmt"
	"math"
	"strconv"

	"go.yaml.in/yaml/v3"
)

// The file as written, with the line of each part for errors.
type yRoot struct {
	domain      string
	line        int
	descriptors []yDescriptor
}

type yDescriptor struct {
	key, value  string
	rateLimit   *yRateLimit
	descriptors []yDescriptor
	shadow      bool
	quota       bool
	share       bool
	line        int
}

type yRateLimit struct {
	unit            string
	requestsPerUnit int64
	unlimited       bool
	name            string
	replaces        []string
	line            int
	// calendar is Tally's extension (calendar: {time_zone: ...}); nil when
	// the rule has none.
	calendar *yCalendar
	// sliding is Tally's extension (sliding: {slices: ...}); nil when the
	// rule has none.
	sliding *ySliding
	// concurrency is Tally's extension (concurrency: {}), the line it is
	// on; 0 when the rule has none.
	concurrency int
	// bucket is Tally's extension (token_bucket: {burst: ...}); nil when
	// the rule has none.
	bucket *yBucket
}

// yBucket is rate_limit.token_bucket, Tally's extension of the reference's
// format: the rule is a token bucket refilled requests_per_unit every unit.
type yBucket struct {
	burst int64 // 0: left out (requests_per_unit)
	line  int
}

// ySliding is rate_limit.sliding, Tally's extension of the reference's
// format: the rule counts in a sliding window of its unit.
type ySliding struct {
	slices int64 // 0: left out (the default)
	line   int
}

// yCalendar is rate_limit.calendar, Tally's extension of the reference's
// format: the rule's windows are periods of a time zone's calendar.
type yCalendar struct {
	zone     string // time_zone as written; "" (left out) is UTC
	zoneLine int
	line     int
}

// validKeys are the keys envoyproxy/ratelimit accepts, at any level (it
// checks names, not places).
var validKeys = map[string]bool{
	"domain": true, "key": true, "value": true, "descriptors": true, "rate_limit": true, "unit": true,
	"requests_per_unit": true, "unlimited": true, "shadow_mode": true, "quota_mode": true, "name": true,
	"replaces": true, "detailed_metric": true, "value_to_metric": true, "share_threshold": true, "metadata": true,
}

// extensionKeys are the keys of Tally's extensions, each accepted only
// under the key that holds it (anywhere else it is unknown, as the
// reference's checks would find it): rate_limit's calendar, sliding,
// concurrency and token_bucket, calendar's time_zone, sliding's slices and
// token_bucket's burst.
var extensionKeys = map[string]string{"calendar": "rate_limit", "time_zone": "calendar", "sliding": "rate_limit", "slices": "sliding",
	"concurrency": "rate_limit", "token_bucket": "rate_limit", "burst": "token_bucket"}

// parse reads one file: its keys checked as envoyproxy/ratelimit checks
// them, its values typed.
func parse(file string, data []byte) (yRoot, []string, error) {
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return yRoot{}, nil, fmt.Errorf("%w: %s: error loading config file: %w", ErrInvalid, file, err)
	}
	p := &parser{file: file}
	if doc.Kind == 0 || len(doc.Content) == 0 {
		return yRoot{}, nil, invalid(file, 1, "config file cannot have empty domain")
	}
	top := doc.Content[0]
	if err := p.checkKeys(top, ""); err != nil {
		return yRoot{}, nil, err
	}
	root := yRoot{line: top.Line}
	err := p.fields(top, "the file", func(k string, v *yaml.Node) error {
		var err error
		switch k {
		case "domain":
			root.domain, err = p.str(v)
		case "descriptors":
			root.descriptors, err = p.descriptorList(v)
		default:
			p.ignored(k, v, "the file's top level")
		}
		return err
	})
	if err != nil {
		return yRoot{}, nil, err
	}
	if root.domain == "" {
		return yRoot{}, nil, invalid(file, top.Line, "config file cannot have empty domain")
	}
	return root, p.warnings, nil
}

type parser struct {
	file     string
	warnings []string
}

// checkKeys refuses, anywhere in the tree, a key envoyproxy/ratelimit does
// not know (but Tally's extensions, each under the key that holds it:
// extensionKeys), a list of anything but maps, and a value of a type it
// does not take; metadata's contents are free. parent is the key whose
// value n is ("" at the top).
func (p *parser) checkKeys(n *yaml.Node, parent string) error {
	switch n.Kind {
	case yaml.DocumentNode:
		for _, c := range n.Content {
			if err := p.checkKeys(c, parent); err != nil {
				return err
			}
		}
	case yaml.MappingNode:
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			if k.Kind != yaml.ScalarNode || k.Tag != "!!str" {
				return invalid(p.file, k.Line, "config error, key is not of type string: %v", k.Value)
			}
			known := validKeys[k.Value] && parent != "calendar" && parent != "sliding" && parent != "token_bucket"
			if holder, ok := extensionKeys[k.Value]; ok {
				known = parent == holder
			}
			if !known {
				return invalid(p.file, k.Line, "config error, unknown key '%s'", k.Value)
			}
			if k.Value == "metadata" {
				continue
			}
			switch v.Kind {
			case yaml.SequenceNode:
				for _, e := range v.Content {
					if e.Kind != yaml.MappingNode {
						return invalid(p.file, e.Line, "config error, yaml file contains list of type other than map: %v", e.Value)
					}
					if err := p.checkKeys(e, k.Value); err != nil {
						return err
					}
				}
			case yaml.MappingNode:
				if err := p.checkKeys(v, k.Value); err != nil {
					return err
				}
			case yaml.AliasNode:
				return invalid(p.file, v.Line, "config error, aliases are not supported")
			}
		}
	case yaml.ScalarNode:
		if n.Tag != "!!null" {
			return invalid(p.file, n.Line, "config error, the file is not a map")
		}
	default:
		return invalid(p.file, n.Line, "config error, the file is not a map")
	}
	return nil
}

// fields calls f for each key of the mapping n (what: for errors).
func (p *parser) fields(n *yaml.Node, what string, f func(k string, v *yaml.Node) error) error {
	if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
		return nil
	}
	if n.Kind != yaml.MappingNode {
		return invalid(p.file, n.Line, "%s: want a map", what)
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		if err := f(n.Content[i].Value, n.Content[i+1]); err != nil {
			return err
		}
	}
	return nil
}

func (p *parser) ignored(k string, v *yaml.Node, where string) {
	p.warnings = append(p.warnings, fmt.Sprintf("%s:%d: %q has no meaning in %s (ignored, as envoyproxy/ratelimit ignores it)", p.file, v.Line, k, where))
}

func (p *parser) descriptorList(n *yaml.Node) ([]yDescriptor, error) {
	if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
		return nil, nil
	}
	if n.Kind != yaml.SequenceNode {
		return nil, invalid(p.file, n.Line, "descriptors: want a list")
	}
	out := make([]yDescriptor, 0, len(n.Content))
	for _, e := range n.Content {
		d, err := p.descriptor(e)
		if err != nil {
			return nil, err
		}
		out = append(out, d)
	}
	return out, nil
}

func (p *parser) descriptor(n *yaml.Node) (yDescriptor, error) {
	d := yDescriptor{line: n.Line}
	err := p.fields(n, "a descriptor", func(k string, v *yaml.Node) error {
		var err error
		switch k {
		case "key":
			d.key, err = p.str(v)
		case "value":
			d.value, err = p.str(v)
		case "rate_limit":
			d.rateLimit, err = p.rateLimit(v)
		case "descriptors":
			d.descriptors, err = p.descriptorList(v)
		case "shadow_mode":
			d.shadow, err = p.boolean(v)
		case "quota_mode":
			d.quota, err = p.boolean(v)
		case "share_threshold":
			d.share, err = p.boolean(v)
		case "detailed_metric", "value_to_metric", "metadata":
			// What envoyproxy/ratelimit names its stats by, and what it
			// returns as dynamic metadata: Tally's metrics and records are
			// by rule, and it returns no metadata (docs/envoy.md).
			if k != "metadata" {
				_, err = p.boolean(v)
			}
		default:
			p.ignored(k, v, "a descriptor")
		}
		return err
	})
	return d, err
}

func (p *parser) rateLimit(n *yaml.Node) (*yRateLimit, error) {
	rl := &yRateLimit{line: n.Line}
	err := p.fields(n, "rate_limit", func(k string, v *yaml.Node) error {
		var err error
		switch k {
		case "unit":
			rl.unit, err = p.str(v)
		case "requests_per_unit":
			rl.requestsPerUnit, err = p.uint32(v)
		case "unlimited":
			rl.unlimited, err = p.boolean(v)
		case "name":
			rl.name, err = p.str(v)
		case "replaces":
			rl.replaces, err = p.replaces(v)
		case "calendar":
			rl.calendar, err = p.calendar(v)
		case "sliding":
			rl.sliding, err = p.sliding(v)
		case "concurrency":
			if v.Kind != yaml.MappingNode || len(v.Content) != 0 {
				return invalid(p.file, v.Line, "concurrency: want {}: the rule holds requests_per_unit requests in flight, each for a lease of one unit")
			}
			rl.concurrency = v.Line
		case "token_bucket":
			rl.bucket, err = p.bucket(v)
		default:
			p.ignored(k, v, "rate_limit")
		}
		return err
	})
	return rl, err
}

// calendar reads rate_limit.calendar: a map, {} for UTC or {time_zone:
// <IANA name>}.
func (p *parser) calendar(n *yaml.Node) (*yCalendar, error) {
	if n.Kind != yaml.MappingNode {
		return nil, invalid(p.file, n.Line, "calendar: want a map: {} (UTC) or {time_zone: Europe/Berlin}")
	}
	c := &yCalendar{line: n.Line}
	err := p.fields(n, "calendar", func(k string, v *yaml.Node) error {
		// checkKeys let only time_zone through.
		var err error
		c.zone, err = p.str(v)
		if err == nil && c.zone == "" {
			err = invalid(p.file, v.Line, "calendar.time_zone: empty: name an IANA time zone (Europe/Berlin), or leave time_zone out for UTC")
		}
		c.zoneLine = v.Line
		return err
	})
	return c, err
}

// sliding reads rate_limit.sliding: a map, {} for the default slices or
// {slices: n}.
func (p *parser) sliding(n *yaml.Node) (*ySliding, error) {
	if n.Kind != yaml.MappingNode {
		return nil, invalid(p.file, n.Line, "sliding: want a map: {} (10 slices) or {slices: 6}")
	}
	s := &ySliding{line: n.Line}
	err := p.fields(n, "sliding", func(k string, v *yaml.Node) error {
		// checkKeys let only slices through.
		var err error
		s.slices, err = p.uint32(v)
		return err
	})
	return s, err
}

// bucket reads rate_limit.token_bucket: a map, {} for a burst of
// requests_per_unit or {burst: n}.
func (p *parser) bucket(n *yaml.Node) (*yBucket, error) {
	if n.Kind != yaml.MappingNode {
		return nil, invalid(p.file, n.Line, "token_bucket: want a map: {} (a burst of requests_per_unit) or {burst: 20}")
	}
	b := &yBucket{line: n.Line}
	err := p.fields(n, "token_bucket", func(k string, v *yaml.Node) error {
		// checkKeys let only burst through.
		var err error
		b.burst, err = p.uint32(v)
		if err == nil && b.burst == 0 {
			err = invalid(p.file, v.Line, "token_bucket.burst 0: want 1 or more, or leave burst out for requests_per_unit")
		}
		return err
	})
	return b, err
}

func (p *parser) replaces(n *yaml.Node) ([]string, error) {
	if n.Kind != yaml.SequenceNode {
		return nil, invalid(p.file, n.Line, "replaces: want a list of {name: ...}")
	}
	out := make([]string, 0, len(n.Content))
	for _, e := range n.Content {
		name := ""
		err := p.fields(e, "replaces", func(k string, v *yaml.Node) error {
			var err error
			if k == "name" {
				name, err = p.str(v)
			} else {
				p.ignored(k, v, "replaces")
			}
			return err
		})
		if err != nil {
			return nil, err
		}
		out = append(out, name)
	}
	return out, nil
}

// str is a scalar's text (a number or a word is taken as written).
func (p *parser) str(n *yaml.Node) (string, error) {
	if n.Kind != yaml.ScalarNode {
		return "", invalid(p.file, n.Line, "want a string")
	}
	if n.Tag == "!!null" {
		return "", nil
	}
	return n.Value, nil
}

func (p *parser) boolean(n *yaml.Node) (bool, error) {
	if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
		return false, nil
	}
	var b bool
	if n.Kind != yaml.ScalarNode || n.Tag != "!!bool" || n.Decode(&b) != nil {
		return false, invalid(p.file, n.Line, "%q: want true or false", n.Value)
	}
	return b, nil
}

func (p *parser) uint32(n *yaml.Node) (int64, error) {
	if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
		return 0, nil
	}
	if n.Kind == yaml.ScalarNode && n.Tag == "!!int" {
		if v, err := strconv.ParseInt(n.Value, 0, 64); err == nil && v >= 0 && v <= math.MaxUint32 {
			return v, nil
		}
	}
	return 0, invalid(p.file, n.Line, "requests_per_unit %q: want a whole number from 0 to %d", n.Value, uint32(math.MaxUint32))
}

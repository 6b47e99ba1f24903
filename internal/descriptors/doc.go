// Package descriptors reads rate limits written in envoyproxy/ratelimit's
// YAML — the files of a directory, one domain each — and finds the rule an
// Envoy rate-limit request's descriptor falls under, the way
// envoyproxy/ratelimit does, so that its users point Tally at the files they
// already have. It does no I/O beyond reading the files it is given and
// knows nothing of gRPC, Redis or NATS: the edge's rate-limit service
// (internal/edge) turns a matched rule into a limiter.Policy and the
// descriptor's values into the identity whose window counts it.
//
// # The format
//
// A file holds one domain and a tree of descriptors:
//
//	domain: mongo_cps
//	descriptors:
//	  - key: database
//	    value: users
//	    rate_limit:
//	      unit: second
//	      requests_per_unit: 500
//	  - key: remote_address        # no value: every address its own counter
//	    rate_limit: {unit: minute, requests_per_unit: 10}
//	    descriptors:               # nested: matched by the request's next entry
//	      - key: path
//	        value: "/api/*"        # a wildcard: * is any run of characters
//	        rate_limit: {unit: hour, requests_per_unit: 100}
//
// Every key of the reference is accepted: domain, descriptors, key, value,
// rate_limit (unit, requests_per_unit, unlimited, name, replaces),
// shadow_mode, quota_mode, share_threshold, detailed_metric,
// value_to_metric, metadata. docs/envoy.md says what Tally does with each.
// Anything else is refused with its file and line, as the reference refuses
// it — but for three extensions of Tally's:
//
// # Calendar rules (a Tally extension)
//
// rate_limit.calendar makes a rule's windows periods of a time zone's
// calendar rather than the reference's lengths (a month of 30 days from the
// Unix epoch, a UTC day):
//
//	rate_limit:
//	  unit: month                           # day, week (ISO, from Monday), month or year
//	  requests_per_unit: 1000000
//	  calendar: {time_zone: Europe/Berlin}  # an IANA zone; calendar: {} is UTC
//
// calendar is accepted only under rate_limit, and time_zone only under
// calendar; with another unit, with unlimited, or with a zone that does not
// load (or Local) the file is refused with its line. The rule carries it as
// Rule.Calendar and Rule.Location.
//
// # Sliding rules (a Tally extension)
//
// rate_limit.sliding makes a rule admit requests_per_unit in any slices
// consecutive sub-windows of its unit, aligned to the clock, rather than
// per fixed window:
//
//	rate_limit:
//	  unit: minute
//	  requests_per_unit: 100
//	  sliding: {slices: 6}   # sub-windows of ten seconds; sliding: {} is 10
//
// sliding is accepted only under rate_limit, and slices only under
// sliding; a unit that does not divide into slices whole seconds, slices
// out of 2 to 60, unlimited or calendar beside it are refused with the
// line. The rule carries it as Rule.Slices.
//
// # Concurrency rules (a Tally extension)
//
// rate_limit.concurrency: {} makes a rule hold requests_per_unit requests
// in flight at once, each until Envoy's call at its stream's end finishes
// it, or for a lease of one to two units:
//
//	rate_limit:
//	  unit: minute
//	  requests_per_unit: 8
//	  concurrency: {}
//
// concurrency takes no fields; with unlimited, sliding or calendar, or a
// unit of a year, it is refused with the line. The rule carries it as
// Rule.Concurrency.
//
// # Token bucket rules (a Tally extension)
//
// rate_limit.token_bucket makes a rule a token bucket refilled
// requests_per_unit every unit, holding at most burst (default
// requests_per_unit):
//
//	rate_limit:
//	  unit: second
//	  requests_per_unit: 10
//	  token_bucket: {burst: 30}
//
// token_bucket is accepted only under rate_limit, and burst only under
// token_bucket; a burst of 0, a unit of a day or longer, and unlimited,
// calendar, sliding or concurrency beside it are refused with the line.
// The rule carries it as Rule.Burst.
//
// # Matching
//
// A request's descriptor is a list of entries (key, value). Entry by entry
// from the domain's top level, the rule for key_value is looked up first,
// then the first wildcard rule whose key_value pattern matches, then the rule
// for the key alone; a rule with nested descriptors passes the next entry
// down. The descriptor is limited by the rule its last entry lands on, and
// only if that rule has a rate_limit (a descriptor with more or fewer
// entries than the rule's depth is not limited). Each distinct list of
// values counts on its own, except that values matched by a wildcard with
// share_threshold count together under the pattern.
package descriptors

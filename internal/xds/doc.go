// Package xds subscribes to rate-limit rules from an xDS management
// server, as envoyproxy/ratelimit does with CONFIG_TYPE=GRPC_XDS_SOTW and
// as Envoy Gateway serves them: resources of the type
// type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig
// (github.com/envoyproxy/go-control-plane/ratelimit) over the aggregated
// discovery service, state of the world — each response carries every
// domain, and a domain left out is removed.
//
// Each response is turned into files in envoyproxy/ratelimit's YAML (one
// per resource, as the reference converts them) and handed to the caller,
// who reads them with internal/descriptors and puts them in effect. An
// update the caller refuses is NACKed (error_detail, and the version last
// accepted) and the rules in effect stay; an accepted one is ACKed with its
// version. A stream that breaks, or a server that cannot be reached, is
// tried again after a backoff that doubles from Config.BackoffInitial to
// Config.BackoffMax with jitter, and starts over once a stream has
// delivered an update. The node presented is Config.NodeID with
// Config.NodeMetadata (string values), as the reference's.
//
// The package knows nothing of Redis, NATS or the edge.
package xds

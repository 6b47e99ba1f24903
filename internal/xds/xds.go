package xds

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync/atomic"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	rlsconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"go.yaml.in/yaml/v3"
	"google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/tallyhq/tally/internal/descriptors"
)

// TypeURL is the type of the rate-limit rule resources.
const TypeURL = "type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig"

// ErrInvalidConfig is wrapped by the errors of a Config that cannot be
// used.
var ErrInvalidConfig = errors.New("xds: invalid config")

// Config says where the rules come from and what to do with them.
type Config struct {
	// Server is the management server, host:port.
	Server string
	// TLS secures the connection; nil: plain.
	TLS *tls.Config
	// NodeID and NodeMetadata are the node presented to the server.
	NodeID       string
	NodeMetadata map[string]string
	// Headers are gRPC metadata sent on the stream.
	Headers map[string]string
	// BackoffInitial and BackoffMax bound the wait before trying again.
	BackoffInitial, BackoffMax time.Duration
	// MaxMessageBytes bounds one response.
	MaxMessageBytes int
	// Apply is handed each update's rules, one file per resource in
	// envoyproxy/ratelimit's YAML; an error refuses the update (NACK).
	// Calls are serial.
	Apply func(files []descriptors.File) error
	// Log is where connections, updates and refusals are logged.
	Log *slog.Logger
}

// Stats count what the subscription did.
type Stats struct {
	Connects, Accepted, Refused atomic.Int64
}

// Client is one subscription.
type Client struct {
	c     Config
	stats Stats
	// version is the version last accepted.
	version string
}

// New checks c and returns its subscription; Run runs it.
func New(c Config) (*Client, error) {
	switch {
	case c.Server == "":
		return nil, fmt.Errorf("%w: no server", ErrInvalidConfig)
	case c.Apply == nil:
		return nil, fmt.Errorf("%w: no Apply", ErrInvalidConfig)
	case c.BackoffInitial <= 0 || c.BackoffMax < c.BackoffInitial:
		return nil, fmt.Errorf("%w: backoff %v to %v", ErrInvalidConfig, c.BackoffInitial, c.BackoffMax)
	}
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	if c.MaxMessageBytes <= 0 {
		c.MaxMessageBytes = 4 << 20
	}
	return &Client{c: c}, nil
}

// Stats are the subscription's counters.
func (cl *Client) Stats() *Stats { return &cl.stats }

// Run subscribes until ctx ends, reconnecting after each failure; it
// returns nil then.
func (cl *Client) Run(ctx context.Context) error {
	wait := cl.c.BackoffInitial
	for ctx.Err() == nil {
		got, err := cl.stream(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if got {
			wait = cl.c.BackoffInitial // the server worked: start over
		}
		d := jitter(wait)
		cl.c.Log.Warn("xDS stream to the management server ended; the rules in effect stay", "server", cl.c.Server,
			"version", cl.version, "err", err, "retry_in", d.Round(time.Millisecond))
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
		wait = min(2*wait, cl.c.BackoffMax)
	}
	return nil
}

// jitter is d give or take a quarter.
func jitter(d time.Duration) time.Duration {
	return d*3/4 + time.Duration(rand.Int64N(int64(d)/2+1))
}

// stream runs one stream until it fails; got says whether it delivered
// an update.
func (cl *Client) stream(ctx context.Context) (got bool, err error) {
	creds := insecure.NewCredentials()
	if cl.c.TLS != nil {
		creds = credentials.NewTLS(cl.c.TLS)
	}
	conn, err := grpc.NewClient(cl.c.Server, grpc.WithTransportCredentials(creds),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(cl.c.MaxMessageBytes)))
	if err != nil {
		return false, err
	}
	defer conn.Close()
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if len(cl.c.Headers) > 0 {
		sctx = metadata.NewOutgoingContext(sctx, metadata.New(cl.c.Headers))
	}
	st, err := discoveryv3.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(sctx, grpc.WaitForReady(false))
	if err != nil {
		return false, err
	}
	node := cl.node()
	// The first request asks for every resource of the type, with the
	// version last accepted (a server that still has it need not resend).
	if err := st.Send(&discoveryv3.DiscoveryRequest{Node: node, TypeUrl: TypeURL, VersionInfo: cl.version}); err != nil {
		return false, err
	}
	cl.stats.Connects.Add(1)
	cl.c.Log.Info("xDS stream to the management server open", "server", cl.c.Server, "node", node.Id)
	var refused string      // the version last refused
	var again time.Duration // the pause before NACKing it again
	for {
		resp, err := st.Recv()
		if err != nil {
			return got, err
		}
		got = true
		req := &discoveryv3.DiscoveryRequest{Node: node, TypeUrl: TypeURL, ResponseNonce: resp.Nonce}
		if err := cl.apply(resp); err != nil {
			cl.stats.Refused.Add(1)
			req.VersionInfo = cl.version
			req.ErrorDetail = &status.Status{Code: int32(codes.InvalidArgument), Message: err.Error()}
			// A server resends what was refused at once (go-control-plane's
			// does): the same version refused again is NACKed after a
			// doubling pause, and logged once.
			if resp.VersionInfo == refused {
				again = min(max(2*again, cl.c.BackoffInitial), cl.c.BackoffMax)
				t := time.NewTimer(jitter(again))
				select {
				case <-ctx.Done():
					t.Stop()
					return got, ctx.Err()
				case <-t.C:
				}
			} else {
				refused, again = resp.VersionInfo, 0
				cl.c.Log.Error("xDS update refused; the rules in effect stay", "version", resp.VersionInfo, "err", err)
			}
		} else {
			refused, again = "", 0
			cl.stats.Accepted.Add(1)
			cl.version = resp.VersionInfo
			cl.c.Log.Info("xDS update applied", "version", resp.VersionInfo, "resources", len(resp.Resources))
			req.VersionInfo = resp.VersionInfo
		}
		if err := st.Send(req); err != nil {
			return got, err
		}
	}
}

func (cl *Client) node() *corev3.Node {
	md := map[string]*structpb.Value{}
	for k, v := range cl.c.NodeMetadata {
		md[k] = structpb.NewStringValue(v)
	}
	return &corev3.Node{Id: cl.c.NodeID, Metadata: &structpb.Struct{Fields: md}}
}

// apply converts a response and hands it to Apply.
func (cl *Client) apply(resp *discoveryv3.DiscoveryResponse) error {
	if resp.TypeUrl != TypeURL {
		return fmt.Errorf("a response of type %q: want %s", resp.TypeUrl, TypeURL)
	}
	files := make([]descriptors.File, 0, len(resp.Resources))
	for i, r := range resp.Resources {
		f, err := File(r)
		if err != nil {
			return fmt.Errorf("resource %d: %w", i, err)
		}
		files = append(files, f)
	}
	return cl.c.Apply(files)
}

// File is one resource as a file of envoyproxy/ratelimit's YAML, named
// after the resource ("xds:NAME"), as the reference converts it.
func File(r *anypb.Any) (descriptors.File, error) {
	var c rlsconfv3.RateLimitConfig
	if err := anypb.UnmarshalTo(r, &c, proto.UnmarshalOptions{}); err != nil {
		return descriptors.File{}, err
	}
	data, err := yaml.Marshal(map[string]any{"domain": c.Domain, "descriptors": yamlDescriptors(c.Descriptors)})
	if err != nil {
		return descriptors.File{}, err
	}
	return descriptors.File{Name: "xds:" + c.Name, Data: data}, nil
}

func yamlDescriptors(ds []*rlsconfv3.RateLimitDescriptor) []map[string]any {
	out := make([]map[string]any, 0, len(ds))
	for _, d := range ds {
		m := map[string]any{"key": d.Key}
		if d.Value != "" {
			m["value"] = d.Value
		}
		if d.ShadowMode {
			m["shadow_mode"] = true
		}
		if d.DetailedMetric {
			m["detailed_metric"] = true
		}
		if rl := d.RateLimit; rl != nil {
			r := map[string]any{"unit": rl.Unit.String(), "requests_per_unit": rl.RequestsPerUnit}
			if rl.Unlimited {
				r["unlimited"] = true
			}
			if rl.Name != "" {
				r["name"] = rl.Name
			}
			if len(rl.Replaces) > 0 {
				var rs []map[string]any
				for _, x := range rl.Replaces {
					rs = append(rs, map[string]any{"name": x.Name})
				}
				r["replaces"] = rs
			}
			m["rate_limit"] = r
		}
		if len(d.Descriptors) > 0 {
			m["descriptors"] = yamlDescriptors(d.Descriptors)
		}
		out = append(out, m)
	}
	return out
}

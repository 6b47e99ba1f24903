package gateways_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/tallyhq/tally/internal/cli"
	"github.com/tallyhq/tally/internal/testutil"
)

// traefikStatic is what deploy/traefik/traefik.yml holds: Traefik's static
// configuration (the names are Traefik v3's).
type traefikStatic struct {
	EntryPoints map[string]struct {
		Address          string `yaml:"address"`
		ForwardedHeaders struct {
			TrustedIPs []string `yaml:"trustedIPs"`
		} `yaml:"forwardedHeaders"`
	} `yaml:"entryPoints"`
	Providers struct {
		File struct {
			Filename string `yaml:"filename"`
		} `yaml:"file"`
	} `yaml:"providers"`
	AccessLog struct {
		FilePath string `yaml:"filePath"`
		Format   string `yaml:"format"`
		Fields   struct {
			DefaultMode string `yaml:"defaultMode"`
			Headers     struct {
				DefaultMode string            `yaml:"defaultMode"`
				Names       map[string]string `yaml:"names"`
			} `yaml:"headers"`
		} `yaml:"fields"`
	} `yaml:"accessLog"`
}

// traefikDynamic is what deploy/traefik/dynamic.yml holds: the file
// provider's routers, middlewares and services.
type traefikDynamic struct {
	HTTP struct {
		Middlewares map[string]struct {
			ForwardAuth struct {
				Address             string   `yaml:"address"`
				TrustForwardHeader  *bool    `yaml:"trustForwardHeader"`
				MaxResponseBodySize *int64   `yaml:"maxResponseBodySize"`
				AuthResponseHeaders []string `yaml:"authResponseHeaders"`
			} `yaml:"forwardAuth"`
		} `yaml:"middlewares"`
		Routers map[string]struct {
			EntryPoints []string `yaml:"entryPoints"`
			Rule        string   `yaml:"rule"`
			Middlewares []string `yaml:"middlewares"`
			Service     string   `yaml:"service"`
		} `yaml:"routers"`
		Services map[string]struct {
			LoadBalancer struct {
				Servers []struct {
					URL string `yaml:"url"`
				} `yaml:"servers"`
			} `yaml:"loadBalancer"`
		} `yaml:"services"`
	} `yaml:"http"`
}

// readYAML decodes a shipped file strictly: a key the type does not name
// (a misspelt one, which Traefik would ignore silently) is an error.
func readYAML(t *testing.T, path string, v any) {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	require.NoError(t, dec.Decode(v), path)
}

// The files deploy/traefik ships parse, and hold what docs/traefik.md
// says: the static part (an entry point trusting the load balancers, the
// file provider, the JSON access log keeping Tally-Request-Id) and the
// dynamic part (ForwardAuth to /auth/traefik passing the entry point's
// X-Forwarded-* headers on, its answers bounded, the headers copied; a
// router through it on that entry point).
func TestTraefikConfigurationParses(t *testing.T) {
	var st traefikStatic
	readYAML(t, "../../deploy/traefik/traefik.yml", &st)
	var dyn traefikDynamic
	readYAML(t, "../../deploy/traefik/dynamic.yml", &dyn)

	require.Len(t, st.EntryPoints, 1)
	for name, ep := range st.EntryPoints {
		require.NotEmpty(t, ep.Address, name)
		require.NotEmpty(t, ep.ForwardedHeaders.TrustedIPs, "the load balancers' addresses")
		for _, ip := range ep.ForwardedHeaders.TrustedIPs {
			_, err := netip.ParsePrefix(ip)
			require.NoError(t, err, ip)
		}
		for rname, r := range dyn.HTTP.Routers {
			require.Equal(t, []string{name}, r.EntryPoints, rname)
			require.Equal(t, []string{"tally"}, r.Middlewares, rname)
			require.Contains(t, dyn.HTTP.Services, r.Service, rname)
		}
	}
	require.True(t, strings.HasSuffix(st.Providers.File.Filename, "/dynamic.yml"), st.Providers.File.Filename)
	require.NotEmpty(t, st.AccessLog.FilePath, "Traefik writes its access log to a file (or stdout)")
	require.Equal(t, "json", st.AccessLog.Format)
	require.Equal(t, "drop", st.AccessLog.Fields.Headers.DefaultMode)
	require.Equal(t, "keep", st.AccessLog.Fields.Headers.Names["Tally-Request-Id"])

	fa := dyn.HTTP.Middlewares["tally"].ForwardAuth
	require.True(t, strings.HasSuffix(fa.Address, "/auth/traefik"), fa.Address)
	require.NotNil(t, fa.TrustForwardHeader)
	require.True(t, *fa.TrustForwardHeader, "the entry point's X-Forwarded-For passed on (else Tally sees only the hop)")
	require.NotNil(t, fa.MaxResponseBodySize)
	require.Greater(t, *fa.MaxResponseBodySize, int64(1024), "room for Tally's problem bodies")
	require.Contains(t, fa.AuthResponseHeaders, "Tally-Request-Id")
}

// traefik plays Traefik v3.7 in front of Tally, from the shipped files: the
// entry point (forwardedheaders) removes the X-Forwarded-* headers of a
// peer outside trustedIPs and adds its own, and ForwardAuth
// (auth/forward.go's writeHeader) passes them on when trustForwardHeader is
// true, appends the peer to X-Forwarded-For, and names the original
// method, host and URI.
type traefik struct {
	address    string         // ForwardAuth's, with the test's port
	trusted    []netip.Prefix // the entry point's trustedIPs
	trustXFH   bool           // trustForwardHeader
	copied     []string       // authResponseHeaders
	logHeaders map[string]string
}

func newTraefik(t *testing.T, fa string) *traefik {
	t.Helper()
	var st traefikStatic
	readYAML(t, "../../deploy/traefik/traefik.yml", &st)
	var dyn traefikDynamic
	readYAML(t, "../../deploy/traefik/dynamic.yml", &dyn)
	mw := dyn.HTTP.Middlewares["tally"].ForwardAuth
	tr := &traefik{address: strings.Replace(mw.Address, "127.0.0.1:8082", fa, 1), trustXFH: mw.TrustForwardHeader != nil && *mw.TrustForwardHeader,
		copied: mw.AuthResponseHeaders, logHeaders: st.AccessLog.Fields.Headers.Names}
	for _, ep := range st.EntryPoints {
		for _, ip := range ep.ForwardedHeaders.TrustedIPs {
			tr.trusted = append(tr.trusted, netip.MustParsePrefix(ip))
		}
	}
	return tr
}

// xHeaders are the headers Traefik's entry point removes from an
// untrusted peer's request (forwardedheaders.DeleteXForwardedHeaders).
var xHeaders = []string{"X-Forwarded-Proto", "X-Forwarded-For", "X-Forwarded-Host", "X-Forwarded-Port", "X-Forwarded-Server",
	"X-Forwarded-Uri", "X-Forwarded-Method", "X-Forwarded-Prefix", "X-Forwarded-Tls-Client-Cert",
	"X-Forwarded-Tls-Client-Cert-Info", "X-Real-Ip"}

// ask is the auth request Traefik makes for a GET of uri on host by peer
// (the address Traefik's connection comes from) carrying hdr.
func (tr *traefik) ask(t *testing.T, peer, uri string, hdr http.Header) *http.Response {
	t.Helper()
	h := hdr.Clone()
	if h == nil {
		h = http.Header{}
	}
	trusted := false
	for _, p := range tr.trusted {
		trusted = trusted || p.Contains(netip.MustParseAddr(peer))
	}
	if !trusted { // the entry point
		for _, k := range xHeaders {
			h.Del(k)
		}
	}
	if h.Get("X-Real-Ip") == "" {
		h.Set("X-Real-Ip", peer)
	}
	for k, v := range map[string]string{"X-Forwarded-Proto": "https", "X-Forwarded-Port": "443", "X-Forwarded-Host": "api.example.com"} {
		if h.Get(k) == "" {
			h.Set(k, v)
		}
	}
	h.Set("X-Forwarded-Server", "traefik-1")
	if !tr.trustXFH { // ForwardAuth
		for _, k := range xHeaders {
			h.Del(k)
		}
	}
	xff := peer
	if prior := h.Values("X-Forwarded-For"); len(prior) > 0 {
		xff = strings.Join(prior, ", ") + ", " + peer
	}
	h.Set("X-Forwarded-For", xff)
	for k, v := range map[string]string{"X-Forwarded-Method": "GET", "X-Forwarded-Proto": "https", "X-Forwarded-Host": "api.example.com",
		"X-Forwarded-Uri": uri} {
		if h.Get(k) == "" {
			h.Set(k, v)
		}
	}
	req, err := http.NewRequest("GET", tr.address, nil)
	require.NoError(t, err)
	req.Header = h
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp
}

// logEntry is the JSON access-log line Traefik writes for a request it
// answered with status, the headers authResponseHeaders copied onto it
// logged as the static configuration says.
func (tr *traefik) logEntry(t *testing.T, allowed *http.Response, status int) string {
	t.Helper()
	e := map[string]any{"ClientHost": "203.0.113.7", "DownstreamStatus": status, "RequestMethod": "GET", "RequestPath": "/repos",
		"RouterName": "api@file", "level": "info", "msg": "", "time": time.Now().Format(time.RFC3339)}
	for name, mode := range tr.logHeaders {
		if mode == "keep" && allowed.Header.Get(name) != "" {
			e["request_"+name] = allowed.Header.Get(name)
		}
	}
	b, err := json.Marshal(e)
	require.NoError(t, err)
	return string(b)
}

// Behind Traefik, as shipped, and a load balancer it trusts: an
// address-keyed limit counts each client's address, not a hop's; a client
// that reaches Traefik directly and forges X-Forwarded-For counts under its
// own address; a denial is a 429 with Retry-After that Traefik passes on;
// and Traefik's access log, sent on by `tally ship-access-log`, gives a 304
// its charge back.
func TestTraefik(t *testing.T) {
	var st traefikStatic
	readYAML(t, "../../deploy/traefik/traefik.yml", &st)
	var balancers []string
	for _, ep := range st.EntryPoints {
		balancers = append(balancers, ep.ForwardedHeaders.TrustedIPs...)
	}
	// Tally trusts the balancers as Traefik does (docs/traefik.md), and
	// Traefik (the test, on loopback) as its gateway.
	fa, logAddr, _ := tallyFor(t, "127.0.0.1", strings.Join(balancers, ", "))
	tr := newTraefik(t, fa)
	lb := netip.MustParsePrefix(balancers[0]).Addr().String()
	viaLB := func(client string) *http.Response {
		return tr.ask(t, lb, "/repos?page=2", http.Header{"X-Forwarded-For": {client}}) // no Authorization: keyed by address
	}
	for _, client := range []string{"203.0.113.7", "203.0.113.8"} {
		for i := range limit {
			resp := viaLB(client)
			require.Equal(t, 200, resp.StatusCode, "%s: request %d: each client has a window of its own", client, i+1)
			for _, h := range tr.copied {
				if h != "X-RateLimit-Used" || i > 0 {
					require.NotEmpty(t, resp.Header.Get(h), h)
				}
			}
		}
		resp := viaLB(client)
		require.Equal(t, 429, resp.StatusCode, client)
		require.NotEmpty(t, resp.Header.Get("Retry-After"))
		require.Equal(t, "application/problem+json", resp.Header.Get("Content-Type"))
	}
	// Not behind the balancer: its own X-Forwarded-For is removed at the
	// door, and it is counted as itself, not as the client it names.
	forged := tr.ask(t, "198.51.100.4", "/repos", http.Header{"X-Forwarded-For": {"203.0.113.9"}})
	require.Equal(t, 200, forged.StatusCode)
	require.Equal(t, fmt.Sprint(limit-1), forged.Header.Get("X-RateLimit-Remaining"))
	own := viaLB("203.0.113.9")
	require.Equal(t, 200, own.StatusCode)
	require.Equal(t, fmt.Sprint(limit-1), own.Header.Get("X-RateLimit-Remaining"), "the named address's window was untouched")

	// 304s: a client spends its window, one of its requests was a 304;
	// Traefik's access log line for it, shipped, gives it back.
	var first *http.Response
	for i := range limit {
		resp := viaLB("203.0.113.10")
		require.Equal(t, 200, resp.StatusCode)
		if i == 0 {
			first = resp
		}
	}
	require.Equal(t, 429, viaLB("203.0.113.10").StatusCode)
	log := strings.Join([]string{
		`time="2026-11-26T10:00:00Z" level=info msg="Traefik's own log, mixed in"`,
		tr.logEntry(t, first, 200),
		tr.logEntry(t, first, 304),
	}, "\n") + "\n"
	var stderr bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	code := cli.Main(ctx, cli.Env{Stdin: strings.NewReader(log), Stdout: io.Discard, Stderr: &stderr}, []string{"ship-access-log", "--to", logAddr})
	require.Equal(t, 0, code, stderr.String())
	require.Contains(t, stderr.String(), "1 304 sent, 1 line skipped")
	testutil.WaitFor(t, "the 304 given back", func() bool { return viaLB("203.0.113.10").StatusCode == 200 })
}

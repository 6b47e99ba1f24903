package ratelimitenv

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/tallyhq/tally/internal/limiter"
)

// ErrRefused is wrapped by the error of a variable Tally cannot honour;
// the message names the variable.
var ErrRefused = errors.New("envoyproxy/ratelimit setting refused")

// Signals are variables whose presence says that the process was started
// with the reference's settings (tally serve reads them then, without
// -envoy-settings, when no configuration file is given).
var Signals = []string{"REDIS_URL", "RUNTIME_ROOT", "CONFIG_TYPE", "REDIS_SOCKET_TYPE"}

// Present reports whether getenv holds any of Signals.
func Present(getenv func(string) string) bool {
	for _, s := range Signals {
		if getenv(s) != "" {
			return true
		}
	}
	return false
}

// Options are Tally's own choices that the reference's settings do not
// make.
type Options struct {
	// DataDir is the embedded NATS's data directory (serve.data_dir).
	DataDir string
	// AdminToken and APIToken say whether TALLY_ADMIN_TOKEN and
	// TALLY_API_TOKEN are set: with the first the debug port listens at
	// DEBUG_HOST, else on loopback; without the second (and without
	// GRPC_CLIENT_TLS_CACERT) the rate-limit service takes calls from
	// anyone who reaches it, as the reference does.
	AdminToken, APIToken bool
	// ExternalNATS says that TALLY_NATS_URL names an external NATS: no
	// server is embedded, and DataDir is not used.
	ExternalNATS bool
}

// Result is the reference's settings as Tally's configuration.
type Result struct {
	// File is the configuration file (YAML) equivalent to the settings.
	File []byte
	// Env are Tally's variables that carry the settings' secrets (Redis
	// credentials), for config.Parse's environment.
	Env map[string]string
	// Notes say, once each, what Tally does not do of the variables set
	// (the Ignored ones).
	Notes []string
	// LogFormat and LogLevel are Tally's (text or json; debug, info, warn
	// or error).
	LogFormat, LogLevel string
}

// Read reads the reference's variables from getenv.
func Read(getenv func(string) string, o Options) (*Result, error) {
	r := &reader{getenv: getenv}
	res := &Result{Env: map[string]string{}}
	var err error
	if res.LogLevel, err = r.logLevel(); err != nil {
		return nil, err
	}
	switch f := strings.ToLower(r.get("LOG_FORMAT")); f {
	case "text", "json":
		res.LogFormat = f
	default:
		return nil, r.refuse("LOG_FORMAT", "want text or json")
	}
	for _, v := range []string{"GRPC_UDS", "GRPC_CLIENT_TLS_SAN"} {
		if r.set(v) {
			return nil, r.refuse(v, "")
		}
	}
	if b := strings.ToLower(r.get("BACKEND_TYPE")); b != "redis" {
		return nil, r.refuse("BACKEND_TYPE", "")
	}
	for _, v := range []string{"LIMIT_LIMIT_HEADER", "LIMIT_REMAINING_HEADER", "LIMIT_RESET_HEADER"} {
		if !strings.EqualFold(r.get(v), r.def(v)) {
			return nil, r.refuse(v, "")
		}
	}
	doc := map[string]any{}
	if p := r.get("CACHE_KEY_PREFIX"); p != "" {
		p = strings.TrimRight(p, ":_")
		if _, err := limiter.NewKeySpace(p, make([]byte, limiter.MinSecretLen)); err != nil {
			return nil, r.refuse("CACHE_KEY_PREFIX", err.Error())
		}
		doc["key_prefix"] = p
	}
	redis, err := r.redis(res.Env)
	if err != nil {
		return nil, err
	}
	doc["redis"] = redis
	edge, err := r.edge(o)
	if err != nil {
		return nil, err
	}
	doc["edge"] = edge
	dir := o.DataDir
	if dir == "" {
		dir = "/var/lib/tally"
	}
	if !o.ExternalNATS {
		doc["serve"] = map[string]any{"data_dir": dir}
	}
	if res.File, err = yaml.Marshal(doc); err != nil {
		return nil, err
	}
	res.Notes = r.notes()
	return res, nil
}

type reader struct {
	getenv func(string) string
	seen   []string
}

// get is the variable's value, or the reference's default.
func (r *reader) get(name string) string {
	if v := strings.TrimSpace(r.getenv(name)); v != "" {
		return v
	}
	return r.def(name)
}

func (r *reader) def(name string) string {
	v, ok := lookup(name)
	if !ok {
		panic("ratelimitenv: unknown variable " + name) // a mistake in this package
	}
	return v.Default
}

// set says whether the variable is set.
func (r *reader) set(name string) bool { return strings.TrimSpace(r.getenv(name)) != "" }

func (r *reader) refuse(name, why string) error {
	v, _ := lookup(name)
	if why == "" {
		why = v.Tally
	}
	return fmt.Errorf("%w: %s=%q: %s", ErrRefused, name, r.getenv(name), why)
}

func (r *reader) bool(name string) (bool, error) {
	b, err := strconv.ParseBool(r.get(name))
	if err != nil {
		return false, r.refuse(name, "want true or false")
	}
	return b, nil
}

func (r *reader) duration(name string) (time.Duration, error) {
	d, err := time.ParseDuration(r.get(name))
	if err != nil {
		return 0, r.refuse(name, "want a duration such as 10s")
	}
	return d, nil
}

// notes say why each ignored variable that is set is ignored, once per
// reason.
func (r *reader) notes() []string {
	var out []string
	said := map[string]bool{}
	for _, v := range append(Variables, Others...) {
		if v.Treatment != Ignored {
			continue
		}
		value := strings.TrimSpace(r.getenv(v.Name))
		// USE_STATSD is on by default: said when it is not turned off.
		if v.Name == "USE_STATSD" && value == "" {
			value = v.Default
		}
		if value == "" || (v.Name == "USE_STATSD" && value == "false") || said[v.Tally] {
			continue
		}
		said[v.Tally] = true
		out = append(out, fmt.Sprintf("%s=%s is ignored: %s", v.Name, value, v.Tally))
	}
	return out
}

func (r *reader) logLevel() (string, error) {
	switch l := strings.ToLower(r.get("LOG_LEVEL")); l {
	case "trace", "debug":
		return "debug", nil
	case "info":
		return "info", nil
	case "warn", "warning":
		return "warn", nil
	case "error", "fatal", "panic":
		return "error", nil
	default:
		return "", r.refuse("LOG_LEVEL", "want trace, debug, info, warn, error, fatal or panic")
	}
}

// hostPort joins a host and a port as the reference listens on them.
func (r *reader) hostPort(hostVar, portVar string) (string, error) {
	port, err := strconv.Atoi(r.get(portVar))
	if err != nil || port < 0 || port > 65535 {
		return "", r.refuse(portVar, "want a port number")
	}
	return net.JoinHostPort(r.get(hostVar), strconv.Itoa(port)), nil
}

// redis is the redis section; credentials go to env.
func (r *reader) redis(env map[string]string) (map[string]any, error) {
	raw := r.get("REDIS_URL")
	socket := strings.ToLower(r.getenv("REDIS_SOCKET_TYPE"))
	switch {
	case socket == "tcp":
	case socket == "" && !strings.HasPrefix(raw, "/"):
		// Unset: the reference would try a Unix socket; a host:port can
		// only mean TCP.
	default:
		return nil, r.refuse("REDIS_SOCKET_TYPE", "Tally reaches Redis over TCP: set tcp, and REDIS_URL to host:port")
	}
	tlsOn, err := r.bool("REDIS_TLS")
	if err != nil {
		return nil, err
	}
	if skip, err := r.bool("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION"); err != nil {
		return nil, err
	} else if skip {
		return nil, r.refuse("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", "")
	}
	if user, pass, found := strings.Cut(r.get("REDIS_AUTH"), ":"); found {
		env["TALLY_REDIS_USERNAME"], env["TALLY_REDIS_PASSWORD"] = user, pass
	} else if user != "" {
		env["TALLY_REDIS_PASSWORD"] = user
	}
	sh := map[string]any{"name": "s0"}
	switch t := strings.ToUpper(r.get("REDIS_TYPE")); t {
	case "SINGLE":
		addr, scheme, err := r.redisAddr(raw)
		if err != nil {
			return nil, err
		}
		if scheme == "rediss" {
			tlsOn = true
		}
		sh["primary"] = map[string]any{"addr": addr}
	case "SENTINEL":
		parts := strings.Split(raw, ",")
		if len(parts) < 2 || parts[0] == "" {
			return nil, r.refuse("REDIS_URL", "with REDIS_TYPE=SENTINEL want master,host:port[,host:port...]")
		}
		for _, a := range parts[1:] {
			if _, _, err := net.SplitHostPort(strings.TrimSpace(a)); err != nil {
				return nil, r.refuse("REDIS_URL", "with REDIS_TYPE=SENTINEL want master,host:port[,host:port...]")
			}
		}
		sh["sentinel"] = map[string]any{"master": parts[0], "addrs": trimAll(parts[1:])}
		if p := r.get("REDIS_SENTINEL_AUTH"); p != "" {
			env["TALLY_SENTINEL_PASSWORD"] = p
		}
	case "CLUSTER":
		return nil, r.refuse("REDIS_TYPE", "Redis Cluster is not supported yet (on Tally's roadmap): use SINGLE or SENTINEL")
	default:
		return nil, r.refuse("REDIS_TYPE", "want SINGLE or SENTINEL")
	}
	out := map[string]any{"shards": []any{sh}}
	if tlsOn {
		t := map[string]any{"enabled": true}
		for v, field := range map[string]string{"REDIS_TLS_CLIENT_CERT": "cert_file", "REDIS_TLS_CLIENT_KEY": "key_file", "REDIS_TLS_CACERT": "ca_file"} {
			if p := r.get(v); p != "" {
				t[field] = p
			}
		}
		out["tls"] = t
	}
	if r.set("REDIS_TIMEOUT") {
		d, err := r.duration("REDIS_TIMEOUT")
		if err != nil {
			return nil, err
		}
		if d <= 0 || d > time.Minute {
			return nil, r.refuse("REDIS_TIMEOUT", "want a duration above 0 and up to 1m")
		}
		out["timeout"] = d.String()
	}
	return out, nil
}

// redisAddr reads REDIS_URL's host:port (or a redis:// or rediss:// URL,
// whose credentials are refused: they go in REDIS_AUTH).
func (r *reader) redisAddr(raw string) (addr, scheme string, err error) {
	if strings.Contains(raw, "://") {
		u, err := url.Parse(raw)
		if err != nil || (u.Scheme != "redis" && u.Scheme != "rediss") || u.User != nil || u.Port() == "" {
			return "", "", r.refuse("REDIS_URL", "want host:port, or redis://host:port (credentials in REDIS_AUTH)")
		}
		return u.Host, u.Scheme, nil
	}
	if _, _, err := net.SplitHostPort(raw); err != nil || strings.Contains(raw, ",") {
		return "", "", r.refuse("REDIS_URL", "want host:port (REDIS_TYPE=CLUSTER is not supported)")
	}
	return raw, "redis", nil
}

func trimAll(ss []string) []string {
	out := make([]string, len(ss))
	for i, s := range ss {
		out[i] = strings.TrimSpace(s)
	}
	return out
}

// edge is the edge section: the rate-limit service's listeners, its rules,
// the debug port and Prometheus.
func (r *reader) edge(o Options) (map[string]any, error) {
	grpcAddr, err := r.hostPort("GRPC_HOST", "GRPC_PORT")
	if err != nil {
		return nil, err
	}
	httpAddr, err := r.hostPort("HOST", "PORT")
	if err != nil {
		return nil, err
	}
	rls := map[string]any{"listen": grpcAddr, "http_listen": httpAddr}
	for v, field := range map[string]string{"LIMIT_RESPONSE_HEADERS_ENABLED": "response_headers", "SHADOW_MODE": "shadow_mode",
		"QUOTA_MODE": "quota_mode", "MERGE_DOMAIN_CONFIG": "merge_domains", "HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED": "health_needs_rules"} {
		b, err := r.bool(v)
		if err != nil {
			return nil, err
		}
		if b {
			rls[field] = true
		}
	}
	useTLS, err := r.bool("GRPC_SERVER_USE_TLS")
	if err != nil {
		return nil, err
	}
	clientCA := ""
	if useTLS {
		if !r.set("GRPC_SERVER_TLS_CERT") || !r.set("GRPC_SERVER_TLS_KEY") {
			return nil, r.refuse("GRPC_SERVER_USE_TLS", "set GRPC_SERVER_TLS_CERT and GRPC_SERVER_TLS_KEY with it")
		}
		t := map[string]any{"cert_file": r.get("GRPC_SERVER_TLS_CERT"), "key_file": r.get("GRPC_SERVER_TLS_KEY")}
		if clientCA = r.get("GRPC_CLIENT_TLS_CACERT"); clientCA != "" {
			t["client_ca_file"] = clientCA
		}
		rls["tls"] = t
	}
	if !o.APIToken && clientCA == "" {
		rls["unauthenticated"] = true // as the reference: said in the log at start
	}
	switch t := strings.ToUpper(r.get("CONFIG_TYPE")); t {
	case "FILE":
		rls["config"] = filepath.Join(r.get("RUNTIME_ROOT"), r.get("RUNTIME_SUBDIRECTORY"), r.get("RUNTIME_APPDIRECTORY"))
	case "GRPC_XDS_SOTW":
		x, err := r.xds()
		if err != nil {
			return nil, err
		}
		rls["xds"] = x
	default:
		return nil, r.refuse("CONFIG_TYPE", "want FILE or GRPC_XDS_SOTW")
	}
	// Windows aligned to the clock, as the reference's: every domain's.
	rls["clock_windows"] = []any{"*"}
	edge := map[string]any{"rls": rls}
	debug, err := r.hostPort("DEBUG_HOST", "DEBUG_PORT")
	if err != nil {
		return nil, err
	}
	if !o.AdminToken {
		_, port, _ := net.SplitHostPort(debug)
		debug = net.JoinHostPort("127.0.0.1", port)
	}
	edge["admin_listen"] = debug
	if prom, err := r.bool("USE_PROMETHEUS"); err != nil {
		return nil, err
	} else if prom {
		addr := r.get("PROMETHEUS_ADDR")
		if _, _, err := net.SplitHostPort(addr); err != nil {
			return nil, r.refuse("PROMETHEUS_ADDR", "want host:port or :port")
		}
		edge["metrics"] = map[string]any{"listen": addr, "path": r.get("PROMETHEUS_PATH")}
	}
	return edge, nil
}

// xds is edge.rls.xds.
func (r *reader) xds() (map[string]any, error) {
	x := map[string]any{"server": r.get("CONFIG_GRPC_XDS_SERVER_URL"), "node_id": r.get("CONFIG_GRPC_XDS_NODE_ID")}
	if md := r.get("CONFIG_GRPC_XDS_NODE_METADATA"); md != "" {
		m := map[string]string{}
		// As the reference: entries key=value, separated by commas;
		// others are skipped.
		for _, e := range strings.Split(md, ",") {
			if k, v, ok := strings.Cut(e, "="); ok {
				m[k] = v
			}
		}
		x["node_metadata"] = m
	}
	if h := r.get("CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS"); h != "" {
		m := map[string]string{}
		for _, e := range strings.Split(h, ",") {
			k, v, ok := strings.Cut(e, ":")
			if !ok {
				return nil, r.refuse("CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS", "want key:value,key:value")
			}
			m[strings.TrimSpace(k)] = strings.TrimSpace(v)
		}
		x["headers"] = m
	}
	useTLS, err := r.bool("CONFIG_GRPC_XDS_SERVER_USE_TLS")
	if err != nil {
		return nil, err
	}
	if useTLS {
		t := map[string]any{"enabled": true}
		for v, field := range map[string]string{"CONFIG_GRPC_XDS_CLIENT_TLS_CERT": "cert_file", "CONFIG_GRPC_XDS_CLIENT_TLS_KEY": "key_file",
			"CONFIG_GRPC_XDS_SERVER_TLS_CACERT": "ca_file", "CONFIG_GRPC_XDS_SERVER_TLS_SAN": "server_name"} {
			if p := r.get(v); p != "" {
				t[field] = p
			}
		}
		x["tls"] = t
	}
	for v, field := range map[string]string{"XDS_CLIENT_BACKOFF_INITIAL_INTERVAL": "backoff_initial", "XDS_CLIENT_BACKOFF_MAX_INTERVAL": "backoff_max"} {
		d, err := r.duration(v)
		if err != nil {
			return nil, err
		}
		x[field] = d.String()
	}
	if r.set("XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES") {
		n, err := strconv.Atoi(r.get("XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES"))
		if err != nil {
			return nil, r.refuse("XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES", "want a number of bytes")
		}
		x["max_message_bytes"] = n
	}
	return x, nil
}

// Names lists the variables of Variables and Others set in getenv,
// sorted: what a start with the reference's settings read.
func Names(getenv func(string) string) []string {
	var out []string
	for _, v := range append(Variables, Others...) {
		if getenv(v.Name) != "" {
			out = append(out, v.Name)
		}
	}
	sort.Strings(out)
	return out
}

package shard

import (
	"errors"
	"fmt"
	"net"
	"regexp"
	"strconv"

	"github.com/tallyhq/tally/internal/setting"
)

// ErrInvalidConfig is wrapped by every configuration error.
var ErrInvalidConfig = errors.New("shard: invalid config")

// ReadPolicy says what a read does when every replica of its shard is down.
type ReadPolicy string

const (
	// ReadPrimary sends the read to the shard's primary. This is the default.
	ReadPrimary ReadPolicy = "primary"
	// ReadFail fails the read with an error wrapping ErrNoReplica.
	ReadFail ReadPolicy = "fail"
)

// Node is one Redis server.
type Node struct {
	// Addr is host:port.
	Addr string `yaml:"addr"`
	// Username and Password authenticate with AUTH (ACL user or requirepass).
	// Empty means no authentication.
	Username string `yaml:"username"`
	Password string `yaml:"password"`
	// DB is the logical database, 0 by default.
	DB int `yaml:"db"`
}

// Config describes one shard: fixed addresses (Primary and Replicas), or a
// master that Redis Sentinel watches and fails over (Sentinel).
type Config struct {
	// Name identifies the shard. It drives placement, so renaming a shard
	// moves its keys; it appears in subjects and metrics, so it is limited to
	// [a-z0-9_-], 1 to 32 characters.
	Name string `yaml:"name"`
	// Primary is the shard's primary. With Sentinel, its Addr is empty and
	// its Username, Password and DB apply to every node Sentinel names.
	Primary  Node   `yaml:"primary"`
	Replicas []Node `yaml:"replicas"`
	// Sentinel, when set, names the master the shard is: its primary and
	// replicas are whatever the sentinels say, and follow a failover.
	Sentinel *Sentinel `yaml:"sentinel,omitempty"`
}

// Sentinel names a master watched by Redis Sentinel.
type Sentinel struct {
	// Master is the master's name in the sentinels' configuration
	// ("sentinel monitor <master> ...").
	Master string `yaml:"master"`
	// Addrs are sentinels' host:port (more are discovered from them).
	Addrs []string `yaml:"addrs"`
	// Username and Password authenticate with the sentinels themselves
	// (requirepass or an ACL user in sentinel.conf); empty: none.
	Username string `yaml:"username"`
	Password string `yaml:"password"`
}

// Failover reports whether the shard's primary changes by itself (a
// Sentinel master).
func (c Config) Failover() bool { return c.Sentinel != nil }

var nameRE = regexp.MustCompile(`^[a-z0-9_-]{1,32}$`)

// ConfigError is a configuration problem with the field it is in, below
// the shard list ("shards[1].replicas[0]"; empty for the list as a whole),
// so that callers can point at it (config files report the line). It wraps
// ErrInvalidConfig.
type ConfigError = setting.Error

func configErr(field, format string, args ...any) error {
	return setting.Errorf(ErrInvalidConfig, field, format, args...)
}

// Validate reports the first problem with the shard list as a
// *ConfigError naming the shard and field.
func Validate(shards []Config) error {
	if ps := Problems(shards); len(ps) > 0 {
		return ps[0]
	}
	return nil
}

// Problems reports every problem with the shard list, each a *ConfigError
// naming the shard and field, in the list's order: a bad address does not
// hide a duplicate name.
func Problems(shards []Config) []error {
	if len(shards) == 0 {
		return []error{configErr("", "no shards")}
	}
	var out []error
	seen := make(map[string]bool, len(shards))
	addrs := make(map[string]string)
	for i, s := range shards {
		where := fmt.Sprintf("shards[%d]", i)
		switch {
		case !nameRE.MatchString(s.Name):
			out = append(out, configErr(where+".name", "%q: want 1 to 32 of [a-z0-9_-]", s.Name))
		case seen[s.Name]:
			out = append(out, configErr(where+".name", "%q: duplicate shard name", s.Name))
		}
		seen[s.Name] = true
		if s.Sentinel != nil {
			if err := s.Sentinel.validate(where, s, addrs); err != nil {
				out = append(out, err)
			}
			continue
		}
		nodes := append([]Node{s.Primary}, s.Replicas...)
		for j, n := range nodes {
			field := where + ".primary"
			if j > 0 {
				field = fmt.Sprintf("%s.replicas[%d]", where, j-1)
			}
			if err := n.validate(); err != nil {
				out = append(out, configErr(field, "%v", err))
				continue
			}
			if other, dup := addrs[n.key()]; dup {
				out = append(out, configErr(field, "%s is already %s", n.Addr, other))
				continue
			}
			addrs[n.key()] = field
		}
	}
	return out
}

// validate checks a Sentinel shard: a master name, sentinels' addresses,
// no fixed addresses, and a master no other shard names (two shards on one
// master would share windows).
func (sn *Sentinel) validate(where string, s Config, masters map[string]string) error {
	field := where + ".sentinel"
	switch {
	case s.Primary.Addr != "" || len(s.Replicas) > 0:
		return configErr(field, "a shard names a Sentinel master or fixed addresses (primary.addr, replicas), not both")
	case !masterRE.MatchString(sn.Master):
		return configErr(field+".master", "%q: want the master's name in the sentinels' configuration (1 to 64 of [A-Za-z0-9_.-])", sn.Master)
	case len(sn.Addrs) == 0:
		return configErr(field+".addrs", "no sentinels: want one or more host:port (three or more in production)")
	case s.Primary.DB < 0:
		return configErr(where+".primary.db", "%d: must be >= 0", s.Primary.DB)
	}
	for j, a := range sn.Addrs {
		if err := (Node{Addr: a}).validate(); err != nil {
			return configErr(fmt.Sprintf("%s.addrs[%d]", field, j), "%v", err)
		}
	}
	k := "sentinel:" + sn.Master + "/" + strconv.Itoa(s.Primary.DB)
	if other, dup := masters[k]; dup {
		return configErr(field+".master", "%q is already %s", sn.Master, other)
	}
	masters[k] = field
	return nil
}

var masterRE = regexp.MustCompile(`^[A-Za-z0-9_.-]{1,64}$`)

func (n Node) validate() error {
	host, port, err := net.SplitHostPort(n.Addr)
	if err != nil || host == "" {
		return fmt.Errorf("addr %q: want host:port", n.Addr)
	}
	if p, err := strconv.Atoi(port); err != nil || p < 1 || p > 65535 {
		return fmt.Errorf("addr %q: bad port", n.Addr)
	}
	if n.DB < 0 {
		return fmt.Errorf("db %d: must be >= 0", n.DB)
	}
	return nil
}

// key identifies a node's keyspace: two shards on one server and database
// would share windows.
func (n Node) key() string { return n.Addr + "/" + strconv.Itoa(n.DB) }

// Validate reports whether p is a known policy; the empty policy means
// ReadPrimary.
func (p ReadPolicy) Validate() error {
	switch p {
	case "", ReadPrimary, ReadFail:
		return nil
	}
	return fmt.Errorf("%w: read policy %q: want %q or %q", ErrInvalidConfig, p, ReadPrimary, ReadFail)
}

// Package deploy holds the configuration Tally ships for the servers it
// runs on, embedded so that the tests and the local deployment run with
// exactly what an operator deploys.
package deploy

import _ "embed"

// NATSConfig is nats/tally.conf: JetStream and one user per role, each
// allowed only its subjects.
//
//go:embed nats/tally.conf
var NATSConfig []byte

// NATSClusterConfig is nats/cluster.conf: tally.conf (which must sit
// beside it, as ./tally.conf) in a cluster whose routes authenticate with
// the password in NATSRoutePasswordEnv.
//
//go:embed nats/cluster.conf
var NATSClusterConfig []byte

// NATSRoutePasswordEnv holds the password of NATSClusterConfig's routes.
const NATSRoutePasswordEnv = "TALLY_NATS_ROUTE_PASSWORD"

// NATSPasswordEnv is the environment variable that holds the password of
// a NATS user of NATSConfig.
func NATSPasswordEnv(user string) string {
	b := []byte("TALLY_NATS_" + user + "_PASSWORD")
	for i, c := range b {
		if c >= 'a' && c <= 'z' {
			b[i] = c - 'a' + 'A'
		}
	}
	return string(b)
}

// NATSUsers are the users of NATSConfig.
var NATSUsers = []string{"edge", "accountant", "billing", "analytics", "operator"}

// InboxPrefix is the inbox prefix NATSConfig gives user: replies to a role
// come on subjects only that role may read.
func InboxPrefix(user string) string {
	if user == "operator" {
		return "_INBOX"
	}
	return "_INBOX_" + user
}

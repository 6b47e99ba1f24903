package config

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tallyhq/tally/internal/testpki"
)

// Each listener's TLS is read from the file, checked at load (its files
// read: a missing or mismatched file is refused with its line and field),
// and refused on a listener that is off.
func TestListenerTLS(t *testing.T) {
	ca := testpki.NewCA(t, "tally CA")
	cert, key := ca.Server("edge")
	otherCert, _ := ca.Server("other")
	mutual := "{cert_file: " + cert + ", key_file: " + key + ", client_ca_file: " + ca.File + "}"
	src := strings.Replace(good, "  listen: 127.0.0.1:8080\n", "  listen: 127.0.0.1:8080\n  tls: "+mutual+
		"\n  api_listen: 127.0.0.1:8081\n  api_tls: "+mutual+"\n  admin_tls: {cert_file: "+cert+", key_file: "+key+"}"+
		"\n  forward_auth: {listen: 127.0.0.1:8082, gateways: [127.0.0.1], tls: "+mutual+"}\n", 1) +
		"accountant:\n  admin_listen: 127.0.0.1:9091\n  admin_tls: " + mutual + "\n"
	f, err := Parse([]byte(src), withSecret)
	require.NoError(t, err)
	require.Equal(t, ca.File, f.Edge.TLS.ClientCAFile)
	require.Equal(t, cert, f.Edge.APITLS.CertFile)
	require.Equal(t, key, f.Edge.AdminTLS.KeyFile)
	require.Empty(t, f.Edge.AdminTLS.ClientCAFile)
	require.Equal(t, ca.File, f.Edge.ForwardAuth.TLS.ClientCAFile)
	require.Equal(t, ca.File, f.Accountant.AdminTLS.ClientCAFile)

	missing := filepath.Join(t.TempDir(), "missing.key")
	for _, c := range []struct{ name, from, to, want string }{
		{"key of another certificate", "  tls: {cert_file: " + cert, "  tls: {cert_file: " + otherCert, "line 13: edge.tls.cert_file: " + otherCert + " and key_file " + key + ": tls: private key does not match public key"},
		{"missing key file", "  api_tls: {cert_file: " + cert + ", key_file: " + key, "  api_tls: {cert_file: " + cert + ", key_file: " + missing, "line 15: edge.api_tls.key_file: open " + missing},
		{"no key", "  admin_tls: {cert_file: " + cert + ", key_file: " + key + "}", "  admin_tls: {cert_file: " + cert + "}", "line 16: edge.admin_tls.key_file: missing"},
		{"on a listener that is off", "accountant:\n  admin_listen: 127.0.0.1:9091\n", "accountant:\n", "accountant.admin_tls: set, but accountant.admin_listen is empty"},
		{"a client CA file without a certificate", "  api_tls: {cert_file: " + cert + ", key_file: " + key + ", client_ca_file: " + ca.File, "  api_tls: {cert_file: " + cert + ", key_file: " + key + ", client_ca_file: " + key, "edge.api_tls.client_ca_file: " + key + ": no PEM certificate in it"},
	} {
		t.Run(c.name, func(t *testing.T) {
			bad := strings.Replace(src, c.from, c.to, 1)
			require.NotEqual(t, src, bad, "the case changed nothing")
			_, err := Parse([]byte(bad), withSecret)
			require.ErrorIs(t, err, ErrInvalid)
			require.ErrorContains(t, err, c.want)
		})
	}
}

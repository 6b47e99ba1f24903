package servertls_test

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tallyhq/tally/internal/servertls"
	"github.com/tallyhq/tally/internal/testpki"
	"github.com/tallyhq/tally/internal/testutil"
)

// serve serves "ok" over TLS from files on a loopback port, with the
// server's handshake errors in errs.
func serve(t *testing.T, files *servertls.Files, errs io.Writer) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	hs := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok")) }),
		TLSConfig: files.TLSConfig("h2", "http/1.1"), ReadHeaderTimeout: 5 * time.Second,
		ErrorLog: slog.NewLogLogger(slog.NewTextHandler(errs, nil), slog.LevelWarn)}
	go func() { _ = hs.ServeTLS(ln, "", "") }()
	t.Cleanup(func() { _ = hs.Close() })
	return "https://" + ln.Addr().String()
}

func client(c *tls.Config) *http.Client {
	return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: c}}
}

func get(c *http.Client, url string) error {
	resp, err := c.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err == nil && string(b) != "ok" {
		err = errors.New("unexpected body " + string(b))
	}
	return err
}

// With a client CA, a client without a certificate is refused, one with a
// certificate of another CA is refused (the server says why), and one with
// a certificate of the CA is served. A client that does not trust the
// server's CA fails with the reason.
func TestMutualTLS(t *testing.T) {
	ca, other := testpki.NewCA(t, "tally CA"), testpki.NewCA(t, "another CA")
	cert, key := ca.Server("edge")
	files, err := servertls.Load(servertls.Config{CertFile: cert, KeyFile: key, ClientCAFile: ca.File}, slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	var serverLog testutil.Buffer
	url := serve(t, files, &serverLog)

	err = get(client(testpki.ClientTLS(t, ca, "", "")), url)
	require.Error(t, err, "no client certificate")
	require.ErrorContains(t, err, "certificate required")

	wrongCert, wrongKey := other.Client("intruder")
	err = get(client(testpki.ClientTLS(t, ca, wrongCert, wrongKey)), url)
	require.Error(t, err, "a client certificate of another CA")
	require.ErrorContains(t, err, "unknown certificate authority")
	testutil.WaitFor(t, "the server to log why it refused", func() bool {
		return strings.Contains(serverLog.String(), "certificate signed by unknown authority")
	})

	goodCert, goodKey := ca.Client("gateway")
	require.NoError(t, get(client(testpki.ClientTLS(t, ca, goodCert, goodKey)), url))

	var unknown *tls.CertificateVerificationError
	err = get(client(testpki.ClientTLS(t, other, goodCert, goodKey)), url)
	require.ErrorAs(t, err, &unknown, "a client that trusts another CA")
	require.ErrorContains(t, err, "certificate signed by unknown authority")
}

// Without a client CA no client certificate is asked for.
func TestServerOnly(t *testing.T) {
	ca := testpki.NewCA(t, "tally CA")
	cert, key := ca.Server("edge")
	files, err := servertls.Load(servertls.Config{CertFile: cert, KeyFile: key}, slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	url := serve(t, files, io.Discard)
	require.NoError(t, get(client(testpki.ClientTLS(t, ca, "", "")), url))
	_, err = http.Get(url)
	require.Error(t, err, "a client that does not trust the CA")
}

// A certificate written over the old one is served to the next connection
// without a restart, while a connection opened before keeps working; a
// client CA replaced likewise takes effect for new connections.
func TestRotation(t *testing.T) {
	ca := testpki.NewCA(t, "tally CA")
	dir := t.TempDir()
	cert, key := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	first := ca.IssueTo(cert, key, "edge-1", x509.ExtKeyUsageServerAuth)
	files, err := servertls.Load(servertls.Config{CertFile: cert, KeyFile: key}, slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	url := serve(t, files, io.Discard)

	served := func(c *http.Client) *x509.Certificate {
		resp, err := c.Get(url)
		require.NoError(t, err)
		defer resp.Body.Close()
		_, _ = io.Copy(io.Discard, resp.Body)
		return resp.TLS.PeerCertificates[0]
	}
	kept := client(testpki.ClientTLS(t, ca, "", "")) // keeps its connection open
	require.Equal(t, first.SerialNumber, served(kept).SerialNumber)

	second := ca.IssueTo(cert, key, "edge-2", x509.ExtKeyUsageServerAuth)
	testutil.WaitFor(t, "a new connection to be served the new certificate", func() bool {
		fresh := client(testpki.ClientTLS(t, ca, "", ""))
		defer fresh.CloseIdleConnections()
		return served(fresh).SerialNumber.Cmp(second.SerialNumber) == 0
	})
	require.Equal(t, first.SerialNumber, served(kept).SerialNumber, "the connection opened before is still served, on its handshake")
	require.Equal(t, "edge-2", files.Certificate().Subject.CommonName)
}

// A change that cannot be used — a key that does not match the new
// certificate yet, a file half written — leaves the certificate in use
// served, and the next usable change is taken.
func TestUnusableChangeKeepsServing(t *testing.T) {
	ca := testpki.NewCA(t, "tally CA")
	dir := t.TempDir()
	cert, key := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	first := ca.IssueTo(cert, key, "edge-1", x509.ExtKeyUsageServerAuth)
	var log testutil.Buffer
	files, err := servertls.Load(servertls.Config{CertFile: cert, KeyFile: key}, slog.New(slog.NewTextHandler(&log, nil)))
	require.NoError(t, err)
	url := serve(t, files, io.Discard)

	require.NoError(t, os.WriteFile(cert, []byte("-----BEGIN CERTIFICATE-----\nhalf"), 0o600))
	testutil.WaitFor(t, "the unusable change to be logged", func() bool {
		c := client(testpki.ClientTLS(t, ca, "", ""))
		defer c.CloseIdleConnections()
		require.NoError(t, get(c, url), "the old certificate is still served")
		return strings.Contains(log.String(), "TLS files changed but cannot be used")
	})
	require.Equal(t, first.SerialNumber, files.Certificate().SerialNumber)

	second := ca.IssueTo(cert, key, "edge-2", x509.ExtKeyUsageServerAuth)
	testutil.WaitFor(t, "the next usable change to be taken", func() bool {
		return files.Certificate().SerialNumber.Cmp(second.SerialNumber) == 0
	})
	require.Contains(t, log.String(), "TLS certificate reloaded")
}

// Settings that cannot be served are refused with the field and the file.
func TestValidate(t *testing.T) {
	ca := testpki.NewCA(t, "tally CA")
	cert, key := ca.Server("edge")
	otherCert, _ := ca.Server("other")
	dir := t.TempDir()
	notPEM := filepath.Join(dir, "ca.txt")
	require.NoError(t, os.WriteFile(notPEM, []byte("not a certificate"), 0o600))
	for _, tc := range []struct {
		name string
		cfg  servertls.Config
		want string
	}{
		{"off", servertls.Config{}, ""},
		{"server only", servertls.Config{CertFile: cert, KeyFile: key}, ""},
		{"mTLS", servertls.Config{CertFile: cert, KeyFile: key, ClientCAFile: ca.File}, ""},
		{"no key", servertls.Config{CertFile: cert}, "key_file: missing"},
		{"no certificate", servertls.Config{KeyFile: key}, "cert_file: missing"},
		{"a client CA alone", servertls.Config{ClientCAFile: ca.File}, "cert_file: missing"},
		{"missing file", servertls.Config{CertFile: cert, KeyFile: filepath.Join(dir, "nope.key")}, "key_file: open " + filepath.Join(dir, "nope.key")},
		{"key of another certificate", servertls.Config{CertFile: otherCert, KeyFile: key}, "private key does not match public key"},
		{"a CA file without a certificate", servertls.Config{CertFile: cert, KeyFile: key, ClientCAFile: notPEM}, "client_ca_file: " + notPEM + ": no PEM certificate in it"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.cfg.Validate()
			if tc.want == "" {
				require.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, servertls.ErrInvalid)
			require.ErrorContains(t, err, tc.want)
			_, err = servertls.Load(tc.cfg, slog.New(slog.DiscardHandler))
			require.ErrorContains(t, err, tc.want)
		})
	}
}

// A client CA replaced on disk is enforced on the next connection: a
// client whose CA was taken out is refused, even one that connected
// before and offers to resume its session, and a client of the new CA is
// served.
func TestClientCARotation(t *testing.T) {
	ca, next := testpki.NewCA(t, "tally CA"), testpki.NewCA(t, "next CA")
	dir := t.TempDir()
	cert, key := ca.Server("edge")
	clientCA := filepath.Join(dir, "client-ca.pem")
	raw, err := os.ReadFile(ca.File)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(clientCA, raw, 0o600))
	files, err := servertls.Load(servertls.Config{CertFile: cert, KeyFile: key, ClientCAFile: clientCA}, slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	url := serve(t, files, io.Discard)

	oldCert, oldKey := ca.Client("old-gateway")
	old := testpki.ClientTLS(t, ca, oldCert, oldKey)
	old.ClientSessionCache = tls.NewLRUClientSessionCache(8)
	require.NoError(t, get(client(old), url))

	raw, err = os.ReadFile(next.File)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(clientCA+".new", raw, 0o600))
	require.NoError(t, os.Rename(clientCA+".new", clientCA))
	newCert, newKey := next.Client("new-gateway")
	testutil.WaitFor(t, "the new client CA in effect", func() bool {
		c := client(testpki.ClientTLS(t, ca, newCert, newKey))
		defer c.CloseIdleConnections()
		return get(c, url) == nil
	})
	c := client(old) // a new transport: a new connection, the session cache kept
	err = get(c, url)
	require.Error(t, err, "a client of the CA taken out")
	require.ErrorContains(t, err, "unknown certificate authority")
}

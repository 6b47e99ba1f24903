// Package testpki makes certificate authorities and certificates at run
// time, as PEM files, for tests of TLS: Tally's listeners and its clients
// of Redis and NATS. Nothing it makes is kept.
package testpki

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// CA is a certificate authority.
type CA struct {
	t    testing.TB
	dir  string
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	// File is the CA's certificate (PEM), for ca_file and client_ca_file.
	File string
}

var serial atomic.Int64

// NewCA makes a CA named name, valid for a day around now.
func NewCA(t testing.TB, name string) *CA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial.Add(1)), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require.NoError(t, err)
	cert, err := x509.ParseCertificate(der)
	require.NoError(t, err)
	ca := &CA{t: t, dir: t.TempDir(), cert: cert, key: key}
	ca.File = filepath.Join(ca.dir, "ca.pem")
	write(t, ca.File, "CERTIFICATE", der)
	return ca
}

// Pool holds the CA's certificate.
func (ca *CA) Pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.cert)
	return p
}

// Server issues a server certificate for 127.0.0.1, ::1 and localhost named
// name and returns its files.
func (ca *CA) Server(name string) (certFile, keyFile string) {
	c, k := filepath.Join(ca.dir, name+".pem"), filepath.Join(ca.dir, name+".key")
	ca.IssueTo(c, k, name, x509.ExtKeyUsageServerAuth)
	return c, k
}

// Client issues a client certificate named name and returns its files.
func (ca *CA) Client(name string) (certFile, keyFile string) {
	c, k := filepath.Join(ca.dir, name+".pem"), filepath.Join(ca.dir, name+".key")
	ca.IssueTo(c, k, name, x509.ExtKeyUsageClientAuth)
	return c, k
}

// IssueTo issues a certificate named name for usage and writes it and its
// key to certFile and keyFile, replacing what they held (each file
// replaced at once, as a secret volume or a certificate manager does).
// It returns the certificate.
func (ca *CA) IssueTo(certFile, keyFile, name string, usage x509.ExtKeyUsage) *x509.Certificate {
	t := ca.t
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial.Add(1)), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage},
		DNSNames: []string{"localhost"}, IPAddresses: []net.IP{net.ParseIP("127.0.0.1"), net.ParseIP("::1")}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	require.NoError(t, err)
	keyDER, err := x509.MarshalECPrivateKey(key)
	require.NoError(t, err)
	write(t, keyFile, "EC PRIVATE KEY", keyDER)
	write(t, certFile, "CERTIFICATE", der)
	cert, err := x509.ParseCertificate(der)
	require.NoError(t, err)
	return cert
}

// ClientTLS is a client configuration that trusts ca and, when certFile is
// set, presents that certificate whatever CAs the server asks for (as an
// intruder's client would).
func ClientTLS(t testing.TB, ca *CA, certFile, keyFile string) *tls.Config {
	t.Helper()
	c := &tls.Config{RootCAs: ca.Pool(), MinVersion: tls.VersionTLS12}
	if certFile != "" {
		cert, err := tls.LoadX509KeyPair(certFile, keyFile)
		require.NoError(t, err)
		c.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &cert, nil }
	}
	return c
}

// write replaces path with one PEM block, through a rename.
func write(t testing.TB, path, kind string, der []byte) {
	t.Helper()
	tmp := path + ".new"
	require.NoError(t, os.WriteFile(tmp, pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der}), 0o600))
	require.NoError(t, os.Rename(tmp, path))
}

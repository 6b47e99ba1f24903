// Package servertls is the TLS of Tally's own listeners: a certificate and
// key read from files, read again when the files change (the next handshake
// after a change is served the new certificate; connections already open
// keep theirs and are not dropped), and, when a CA file is given, client
// certificates signed by it required of every client (mTLS).
//
// Files are looked at again at most once per CheckEvery, on a handshake:
// no goroutine runs beside the listener. A change that cannot be used (a
// certificate and key that do not match yet, half-written files, a CA file
// without a certificate) is logged and the files in use stay, until a
// change that can be used.
package servertls

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/tallyhq/tally/internal/setting"
)

// ErrInvalid is wrapped by every error of a listener's TLS settings.
var ErrInvalid = errors.New("tls: invalid")

// Config is the TLS of one listener. It is off unless CertFile and KeyFile
// are set.
type Config struct {
	// CertFile is the server's certificate chain (PEM: the certificate,
	// then its intermediates); KeyFile its private key (PEM).
	CertFile string `yaml:"cert_file"`
	KeyFile  string `yaml:"key_file"`
	// ClientCAFile holds the CAs (PEM) that sign the clients' certificates:
	// when set, every client must present one (mTLS); bearer tokens are
	// still required on top where the listener requires them. Empty: no
	// client certificate is asked for.
	ClientCAFile string `yaml:"client_ca_file"`
}

// On reports whether the listener serves TLS.
func (c Config) On() bool { return c.CertFile != "" || c.KeyFile != "" || c.ClientCAFile != "" }

// Validate reads the files and reports the first problem, naming its field.
func (c Config) Validate() error {
	if !c.On() {
		return nil
	}
	if c.CertFile == "" || c.KeyFile == "" {
		field := "cert_file"
		if c.CertFile != "" {
			field = "key_file"
		}
		return setting.Errorf(ErrInvalid, field, "missing: cert_file and key_file go together (client_ca_file needs both)")
	}
	_, err := read(c)
	return err
}

// CheckEvery is how often, at most, a listener's files are looked at again.
const CheckEvery = time.Second

// Files holds a listener's certificate, key and client CAs as last read.
type Files struct {
	cfg   Config
	log   *slog.Logger
	every time.Duration
	now   func() time.Time

	mu      sync.Mutex
	current *loaded
	failed  []byte // the contents that last failed to load, not to log them twice
	checked time.Time
}

// loaded is one reading of the files.
type loaded struct {
	raw  []byte // the files' contents, to notice a change
	cert tls.Certificate
	leaf *x509.Certificate
	cas  *x509.CertPool
}

// Load reads the files of c (which must be On) and returns them, ready to
// serve; an error names the file and what is wrong with it.
func Load(c Config, log *slog.Logger) (*Files, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	l, err := read(c)
	if err != nil {
		return nil, err
	}
	return &Files{cfg: c, log: log, every: CheckEvery, now: time.Now, current: l}, nil
}

// TLSConfig is a server configuration that offers nextProtos (ALPN, "h2"
// and "http/1.1" for HTTP; gRPC adds its own) and takes the files as they
// are at each handshake.
func (f *Files) TLSConfig(nextProtos ...string) *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		NextProtos: nextProtos,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			l := f.files()
			c := &tls.Config{MinVersion: tls.VersionTLS12, NextProtos: nextProtos, Certificates: []tls.Certificate{l.cert}}
			if l.cas != nil {
				// A resumed session's chain is checked again against these
				// CAs (crypto/tls): a CA taken out lets none of its clients in.
				c.ClientCAs, c.ClientAuth = l.cas, tls.RequireAndVerifyClientCert
			}
			return c, nil
		},
	}
}

// Certificate is the certificate the next handshake serves.
func (f *Files) Certificate() *x509.Certificate { return f.files().leaf }

// files returns what to serve, after reading the files again if they were
// last looked at CheckEvery ago or more.
func (f *Files) files() *loaded {
	f.mu.Lock()
	defer f.mu.Unlock()
	now := f.now()
	if now.Sub(f.checked) < f.every {
		return f.current
	}
	f.checked = now
	raw, err := contents(f.cfg)
	if err == nil && bytes.Equal(raw, f.current.raw) {
		return f.current
	}
	if err == nil && bytes.Equal(raw, f.failed) {
		return f.current // the same unusable change, logged already
	}
	l, err := read(f.cfg)
	if err != nil {
		f.failed = raw
		f.log.Warn("TLS files changed but cannot be used; serving the certificate in use", "cert_file", f.cfg.CertFile, "err", err,
			"serving_not_after", f.current.leaf.NotAfter)
		return f.current
	}
	f.current, f.failed = l, nil
	f.log.Info("TLS certificate reloaded", "cert_file", f.cfg.CertFile, "subject", l.leaf.Subject.String(),
		"not_after", l.leaf.NotAfter, "client_ca", f.cfg.ClientCAFile != "")
	return l
}

// contents are the files' bytes, together.
func contents(c Config) ([]byte, error) {
	var all []byte
	for _, name := range []string{c.CertFile, c.KeyFile, c.ClientCAFile} {
		if name == "" {
			continue
		}
		b, err := os.ReadFile(name)
		if err != nil {
			return nil, err
		}
		all = append(append(all, b...), 0)
	}
	return all, nil
}

// read loads the files of c.
func read(c Config) (*loaded, error) {
	raw, err := contents(c)
	if err != nil {
		return nil, setting.Errorf(ErrInvalid, fieldOf(c, err), "%v", err)
	}
	cert, err := tls.LoadX509KeyPair(c.CertFile, c.KeyFile)
	if err != nil {
		return nil, setting.Errorf(ErrInvalid, "cert_file", "%s and key_file %s: %v", c.CertFile, c.KeyFile, err)
	}
	l := &loaded{raw: raw, cert: cert, leaf: cert.Leaf}
	if l.leaf == nil {
		if l.leaf, err = x509.ParseCertificate(cert.Certificate[0]); err != nil {
			return nil, setting.Errorf(ErrInvalid, "cert_file", "%s: %v", c.CertFile, err)
		}
	}
	if c.ClientCAFile != "" {
		pem, _ := os.ReadFile(c.ClientCAFile) // read just above
		l.cas = x509.NewCertPool()
		if !l.cas.AppendCertsFromPEM(pem) {
			return nil, setting.Errorf(ErrInvalid, "client_ca_file", "%s: no PEM certificate in it", c.ClientCAFile)
		}
	}
	return l, nil
}

// fieldOf names the field whose file err is about.
func fieldOf(c Config, err error) string {
	var pe *os.PathError
	if errors.As(err, &pe) {
		switch pe.Path {
		case c.KeyFile:
			return "key_file"
		case c.ClientCAFile:
			return "client_ca_file"
		}
	}
	return "cert_file"
}

// String names the files, for logs.
func (c Config) String() string {
	s := fmt.Sprintf("cert %s, key %s", c.CertFile, c.KeyFile)
	if c.ClientCAFile != "" {
		s += ", client certificates from " + c.ClientCAFile
	}
	return s
}

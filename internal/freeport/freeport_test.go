package freeport

import (
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// Ports handed out are distinct, outside the kernel's ephemeral range and
// free to bind.
func TestPortsAreDistinctBindableAndOutsideTheEphemeralRange(t *testing.T) {
	lo, hi := candidates()
	seen := map[int]bool{}
	for range 50 {
		p, err := Port()
		if err != nil {
			t.Fatal(err)
		}
		if seen[p] {
			t.Fatalf("port %d handed out twice", p)
		}
		seen[p] = true
		if p < lo || p >= hi {
			t.Fatalf("port %d outside [%d, %d)", p, lo, hi)
		}
		l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p))
		if err != nil {
			t.Fatalf("port %d handed out but not bindable over TCP: %v", p, err)
		}
		l.Close()
		c, err := net.ListenPacket("udp", "127.0.0.1:"+strconv.Itoa(p))
		if err != nil {
			t.Fatalf("port %d handed out but not bindable over UDP: %v", p, err)
		}
		c.Close()
	}
	if b, err := os.ReadFile(ephemeralRangeFile); err == nil {
		t.Logf("ephemeral range %s; ports drawn from [%d, %d)", strings.TrimSpace(string(b)), lo, hi)
	}
}

// A port another process holds the lock of, or that something listens on
// (over UDP here), is never handed out.
func TestLockedOrListenedPortsAreSkipped(t *testing.T) {
	// Three consecutive ports: the first locked by "another process" (a
	// flock on its own open file, which conflicts as another process's
	// would), the second listened on over UDP, the third free.
	var base int
	for base = 20000; base < 30000; base += 3 {
		if _, ok := held[base]; !ok && bindable(base) && bindable(base+1) && bindable(base+2) {
			break
		}
	}
	dir := lockDir()
	if dir == "" {
		t.Skip("no shared lock directory")
	}
	other, err := os.OpenFile(filepath.Join(dir, strconv.Itoa(base)), os.O_CREATE|os.O_RDONLY, 0o444)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if err := tryLock(other); err != nil {
		t.Fatalf("lock port %d: %v", base, err)
	}
	listening, err := net.ListenPacket("udp", "127.0.0.1:"+strconv.Itoa(base+1))
	if err != nil {
		t.Fatal(err)
	}
	defer listening.Close()
	p, err := pick(base, base+3)
	if err != nil {
		t.Fatal(err)
	}
	if p != base+2 {
		t.Fatalf("handed out %d; only %d was free", p, base+2)
	}
	if p, err := pick(base, base+3); err == nil {
		t.Fatalf("handed out %d again or a held one", p)
	}
}

// A lock file that is a link (left by anyone: the directory is shared) is
// never opened through: the port is used without a lock rather than a file
// elsewhere created or locked.
func TestLinkedLockFileIsNotFollowed(t *testing.T) {
	dir := lockDir()
	if dir == "" {
		t.Skip("no shared lock directory")
	}
	var p int
	for p = 30000; p < 32000; p++ {
		if _, ok := held[p]; ok {
			continue
		}
		if _, err := os.Lstat(filepath.Join(dir, strconv.Itoa(p))); os.IsNotExist(err) && bindable(p) {
			break
		}
	}
	target := filepath.Join(t.TempDir(), "target")
	link := filepath.Join(dir, strconv.Itoa(p))
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
	defer os.Remove(link)
	f, ok := lock(dir, p)
	if f != nil {
		f.Close()
		t.Fatalf("port %d: the lock was taken through a link", p)
	}
	if !ok {
		t.Fatalf("port %d: a link was taken for another process's lock", p)
	}
	if _, err := os.Lstat(target); !os.IsNotExist(err) {
		t.Fatalf("the link's target was created (%v)", err)
	}
}

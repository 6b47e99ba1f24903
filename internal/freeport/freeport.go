package freeport

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
)

// The ports handed out lie in [lowest, the start of the ephemeral range).
const lowest = 15000

// ephemeralRangeFile says where Linux draws its ports for port 0 and for
// outgoing connections from (32768-60999 when it cannot be read).
const ephemeralRangeFile = "/proc/sys/net/ipv4/ip_local_port_range"

var (
	mu   sync.Mutex
	held = map[int]*os.File{} // each port handed out, with its lock (open until the process exits; nil without one)
)

// Addr returns "127.0.0.1:port" for a port no other user of this package
// holds and that nothing was listening on a moment ago, over TCP or UDP.
func Addr() (string, error) {
	p, err := Port()
	if err != nil {
		return "", err
	}
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(p)), nil
}

// Port is Addr's port alone.
func Port() (int, error) {
	lo, hi := portRange()
	return pick(lo, hi)
}

// portRange and sharedDir are read once a process: the machine's ephemeral
// range and the lock directory do not change under a test run.
var (
	portRange = sync.OnceValues(candidates)
	sharedDir = sync.OnceValue(lockDir)
)

// pick hands out a port of [lo, hi).
func pick(lo, hi int) (int, error) {
	mu.Lock()
	defer mu.Unlock()
	dir := sharedDir()
	for range 500 {
		p := lo + rand.IntN(hi-lo)
		if _, ok := held[p]; ok {
			continue
		}
		f, ok := lock(dir, p)
		if !ok {
			continue
		}
		if !bindable(p) {
			if f != nil {
				f.Close()
			}
			continue
		}
		held[p] = f
		return p, nil
	}
	return 0, fmt.Errorf("freeport: no free loopback port in [%d, %d) after 500 tries", lo, hi)
}

// candidates is the range ports are drawn from: below the kernel's
// ephemeral range when there is room there, above it otherwise.
func candidates() (lo, hi int) {
	eLo, eHi := 32768, 60999
	if b, err := os.ReadFile(ephemeralRangeFile); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			a, errA := strconv.Atoi(f[0])
			z, errZ := strconv.Atoi(f[1])
			if errA == nil && errZ == nil && a <= z {
				eLo, eHi = a, z
			}
		}
	}
	if eLo-lowest >= 2000 {
		return lowest, eLo
	}
	if 65535-eHi >= 2000 {
		return eHi + 1, 65536
	}
	// The ephemeral range covers nearly everything: draw from all
	// unprivileged ports and rely on the lock and the bind check.
	return 1024, 65536
}

// bindable reports whether nothing listens on port p of the loopback
// address, over TCP or UDP: a port handed out serves either.
func bindable(p int) bool {
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(p))
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return false
	}
	if l.Close() != nil {
		return false
	}
	c, err := net.ListenPacket("udp", addr)
	if err != nil {
		return false
	}
	return c.Close() == nil
}

// lockDir is the directory of the port locks, shared by every process on
// the machine; "" when it cannot be made (ports are then only checked by
// binding them).
func lockDir() string {
	dir := filepath.Join(os.TempDir(), "tally-ports")
	if err := os.Mkdir(dir, os.ModeSticky|0o777); err == nil {
		_ = os.Chmod(dir, os.ModeSticky|0o777) // past the umask: every user shares it
	} else if !errors.Is(err, os.ErrExist) {
		return ""
	}
	// Anyone may have made it first: use it only if it is a directory
	// itself, not a link to another place where files would be created.
	if fi, err := os.Lstat(dir); err != nil || !fi.IsDir() {
		return ""
	}
	return dir
}

// lock takes port p's lock: ok is false when another process holds it. A
// lock that cannot be taken for another reason (no directory, a file of
// another user's) returns ok with no file.
func lock(dir string, p int) (*os.File, bool) {
	if dir == "" {
		return nil, true
	}
	// Never through a link another user left under the port's name.
	f, err := os.OpenFile(filepath.Join(dir, strconv.Itoa(p)), os.O_CREATE|os.O_RDONLY|noFollow, 0o444)
	if err != nil {
		return nil, true
	}
	switch err := tryLock(f); {
	case err == nil:
		return f, true
	case errors.Is(err, errHeld):
		f.Close()
		return nil, false
	default:
		f.Close()
		return nil, true
	}
}

var errHeld = errors.New("freeport: port held by another process")

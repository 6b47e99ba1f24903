//go:build unix

package freeport

import (
	"errors"
	"os"
	"syscall"
)

// tryLock takes an exclusive flock on f without waiting. The kernel drops
// it when the process exits, however it exits.
func tryLock(f *os.File) error {
	err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
	if errors.Is(err, syscall.EWOULDBLOCK) {
		return errHeld
	}
	return err
}

// noFollow makes opening a lock file fail when it is a symbolic link.
const noFollow = syscall.O_NOFOLLOW

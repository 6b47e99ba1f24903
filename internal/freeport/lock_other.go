//go:build !unix

package freeport

import "os"

// tryLock has no lock to take where flock does not exist: ports are only
// checked by binding them.
func tryLock(*os.File) error { return nil }

const noFollow = 0

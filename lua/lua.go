// Package lua holds Tally's Redis scripts, embedded into the binaries.
//
// Each script opens with its contract: the KEYS and ARGV it takes, what it
// returns, and which node it runs on. The scripts that write (open, charge,
// refund) share the window model in window.lua, which is prepended to them
// here; check runs alone, read-only, on replicas.
//
// Scripts touch only the keys passed in KEYS, validate every argument before
// their first write (Lua has no rollback), and take all times from the
// caller: Redis's own clock decides nothing but garbage collection.
package lua

import "embed"

//go:embed *.lua
var files embed.FS

// Sources of the scripts, ready to load with SCRIPT LOAD or EVAL.
var (
	// Check reads a key's live window (read-only; replicas).
	Check = read("check.lua")
	// Open returns the live window, opening one at now when none is live.
	Open = withWindow("open.lua")
	// Charge charges one event to the window live at its start, once.
	Charge = withWindow("charge.lua")
	// Refund gives one event's charge back while its window is live, once.
	Refund = withWindow("refund.lua")
)

func read(name string) string {
	b, err := files.ReadFile(name)
	if err != nil {
		panic("lua: missing embedded script " + name) // a build defect, caught by any test
	}
	return string(b)
}

func withWindow(name string) string {
	return read("window.lua") + "\n" + read(name)
}

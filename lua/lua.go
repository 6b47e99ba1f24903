// Package lua holds Tally's Redis scripts, embedded into the binaries.
//
// Each script opens with its contract: the KEYS and ARGV it takes, what it
// returns, and which node it runs on. The scripts that change windows (take,
// apply, finish, hold, reseed) share the window model in window.lua, which
// is prepended to them here; own is take's path for a holder's own compact
// window alone and slide its path for a sliding window's compact
// sub-windows, each with nothing prepended, and bucket its path for a
// token bucket whose periods near now are missing or compact, with
// record.lua (a bucket's record and arithmetic, which take uses too);
// check runs alone,
// read-only, on replicas; lease
// keeps one accountant active per shard; reseed tells when a shard's primary
// changed and its windows must be re-asserted.
//
// Scripts touch only the keys passed in KEYS, validate every argument before
// their first write (Lua has no rollback), and take all times from the
// caller: Redis's own clock decides nothing but garbage collection.
package lua

import (
	"embed"
	"strings"
)

//go:embed *.lua
var files embed.FS

// Sources of the scripts, ready to load with SCRIPT LOAD or EVAL.
var (
	// Check reads a key's live window (read-only; replicas).
	Check = withCompact("check.lua")
	// Take reserves units of a key's window for an edge, opening the window
	// when none is live.
	Take = withWindowAt("take.lua", "record.lua")
	// Own reserves units of a holder's own compact window, live, or
	// answers that take.lua is the call to send.
	Own = read("own.lua")
	// Slide reserves units of a sliding window's sub-window while the
	// sub-windows of its spans are compact or missing, or answers that
	// take.lua is the call to send.
	Slide = read("slide.lua")
	// Bucket reserves units of a token bucket whose periods near now are
	// missing or compact, the one reserved in missing or the holder's own,
	// or answers that take.lua is the call to send.
	Bucket = read("record.lua") + "\n" + read("bucket.lua")
	// Apply applies a run of producers' accounting events, each once.
	Apply = withWindow("apply.lua")
	// Lease holds or frees an accountant's lease on a shard.
	Lease = read("lease.lua")
	// Finish finishes a decision-API request once, giving a 304's charge
	// back.
	Finish = withWindow("finish.lua")
	// Hold records the share of an edge's credit it will not spend.
	Hold = withWindow("hold.lua")
	// Epoch tells whether a shard's primary is the one its windows were
	// written on, and begins a reseed when it is not.
	Epoch = read("epoch.lua")
	// Reseed re-asserts, during a reseed, what one holder was given in one
	// window.
	Reseed = withWindow("reseed.lua")
)

func read(name string) string {
	b, err := files.ReadFile(name)
	if err != nil {
		panic("lua: missing embedded script " + name) // a build defect, caught by any test
	}
	return string(b)
}

// withCompact is the script name with compact.lua before it.
func withCompact(name string) string {
	return read("compact.lua") + "\n" + read(name)
}

// windowMark is the line of a script where window.lua goes when the script
// runs part of itself before the rest of the model is defined
// (withWindowAt).
const windowMark = "-- (window.lua)\n"

// withWindowAt is the script name with compact.lua before it and
// window.lua, then the scripts more, in place of its windowMark line: what
// runs before that line pays for compact.lua's functions only.
func withWindowAt(name string, more ...string) string {
	before, after, ok := strings.Cut(read(name), windowMark)
	if !ok {
		panic("lua: " + name + " has no line " + strings.TrimSpace(windowMark)) // a build defect, caught by any test
	}
	rest := read("window.lua") + "\n"
	for _, m := range more {
		rest += read(m) + "\n"
	}
	return read("compact.lua") + "\n" + before + rest + after
}

// withWindow is the script name with the window model before it:
// compact.lua, then window.lua.
func withWindow(name string) string {
	return read("compact.lua") + "\n" + read("window.lua") + "\n" + read(name)
}

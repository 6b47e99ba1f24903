package limiter

import (
	"fmt"
	"sync"
	"time"

	// The IANA time zone database, built in: calendar windows follow their
	// zone's calendar on a machine without /usr/share/zoneinfo too (a
	// minimal container image). A system's database, when present, wins.
	_ "time/tzdata"
)

// zones are the time zones loaded so far, by name: a policy or a rule read
// again (a reload) gets the same *time.Location, so that unchanged terms
// compare equal.
var zones sync.Map

// LoadZone loads the IANA time zone name ("" is UTC) for Policy.Location.
// Local is refused: every process must place a window at the same
// instant, whatever its machine's zone. Its errors say what to write.
func LoadZone(name string) (*time.Location, error) {
	if name == "" {
		return time.UTC, nil
	}
	if name == "Local" {
		return nil, fmt.Errorf("%q: the machine's zone differs between machines: name an IANA time zone (Europe/Berlin, UTC)", name)
	}
	if l, ok := zones.Load(name); ok {
		return l.(*time.Location), nil
	}
	l, err := time.LoadLocation(name)
	if err != nil {
		return nil, fmt.Errorf("%q: unknown time zone: want an IANA name (Europe/Berlin, America/New_York, UTC)", name)
	}
	l2, _ := zones.LoadOrStore(name, l)
	return l2.(*time.Location), nil
}

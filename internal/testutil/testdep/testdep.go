// Package testdep decides what a missing test dependency means — a real
// peer or tool the project's own test command installs (Debian's
// python3-zmq, prometheus): a developer's run skips the tests that need it
// with a loud message, and a CI run (environment variable CI non-empty)
// fails them, because the README promises CI runs them and a silent skip
// there would leave the run green with those tests not run.
package testdep

import (
	"fmt"
	"os"
	"testing"
)

// Dep names a dependency for the messages: what the tests lack and how to
// install it.
type Dep struct {
	What, Hint string
}

// Require fails t under CI and skips it elsewhere when probeErr says the
// dependency is missing, and does nothing when it is nil.
func (d Dep) Require(t testing.TB, probeErr error) {
	t.Helper()
	if fatal, msg := d.verdict(os.Getenv("CI") != "", probeErr); msg != "" {
		if fatal {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
}

// verdict is Require's decision: nothing (msg empty) when the probe
// succeeded, else a failure under CI and a skip elsewhere.
func (d Dep) verdict(ci bool, probeErr error) (fatal bool, msg string) {
	if probeErr == nil {
		return false, ""
	}
	if ci {
		return true, fmt.Sprintf("%s missing under CI (%v); %s", d.What, probeErr, d.Hint)
	}
	return false, fmt.Sprintf("SKIPPING: %s missing (%v); %s (under CI=true this fails)", d.What, probeErr, d.Hint)
}

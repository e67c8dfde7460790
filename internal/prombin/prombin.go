// Package prombin gates the tests that run a real Prometheus on Debian's
// prometheus package: /usr/bin/prometheus (started against a live gateway
// to run the dashboard's and the alert rules' queries) and /usr/bin/promtool
// (check rules, test rules).
//
// Without them a developer's run skips those tests with a loud message, but
// a CI run (environment variable CI non-empty) fails: a silent skip there
// would let a renamed metric or label break the dashboard and the alerts
// while the run stays green. The same rule as internal/pyzmq.
package prombin

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
)

// Binaries are the Prometheus programs the tests run.
type Binaries struct {
	Prometheus, Promtool string
}

// installHint is how to get them.
const installHint = "apt-get install prometheus"

// probe finds both binaries on PATH and checks that they run, once per
// test binary.
var probe = sync.OnceValues(func() (Binaries, error) {
	var b Binaries
	for _, p := range []struct {
		name string
		dst  *string
	}{{"prometheus", &b.Prometheus}, {"promtool", &b.Promtool}} {
		path, err := exec.LookPath(p.name)
		if err != nil {
			return Binaries{}, err
		}
		if out, err := exec.Command(path, "--version").CombinedOutput(); err != nil {
			return Binaries{}, fmt.Errorf("%s --version: %v: %s", path, err, strings.TrimSpace(string(out)))
		}
		*p.dst = path
	}
	return b, nil
})

// Require returns the paths of prometheus and promtool if both are
// installed. Otherwise it fails the test when the environment variable CI
// is non-empty and skips it loudly when not.
func Require(t testing.TB) Binaries {
	t.Helper()
	b, err := probe()
	if fatal, msg := verdict(os.Getenv("CI") != "", err); msg != "" {
		if fatal {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	return b
}

// verdict decides what missing binaries mean: nothing (msg empty) when the
// probe succeeded, else a failure under CI and a skip elsewhere.
func verdict(ci bool, probeErr error) (fatal bool, msg string) {
	if probeErr == nil {
		return false, ""
	}
	if ci {
		return true, fmt.Sprintf("prometheus/promtool missing under CI (%v); %s", probeErr, installHint)
	}
	return false, fmt.Sprintf("SKIPPING Prometheus test: prometheus/promtool missing (%v); %s (under CI=true this fails)", probeErr, installHint)
}

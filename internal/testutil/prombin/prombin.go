// Package prombin gates the tests that run a real Prometheus on Debian's
// prometheus package: /usr/bin/prometheus (started against a live gateway
// to run the dashboard's and the alert rules' queries) and /usr/bin/promtool
// (check rules, test rules).
//
// Without them a developer's run skips those tests with a loud message, but
// a CI run (environment variable CI non-empty) fails: a silent skip there
// would let a renamed metric or label break the dashboard and the alerts
// while the run stays green (internal/testutil/testdep).
package prombin

import (
	"fmt"
	"os/exec"
	"strings"
	"sync"
	"testing"

	"github.com/llmgw/caddy-llmgw/internal/testutil/testdep"
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
// installed. Otherwise it fails the test under CI and skips it loudly
// elsewhere (testdep).
func Require(t testing.TB) Binaries {
	t.Helper()
	b, err := probe()
	testdep.Dep{What: "prometheus/promtool", Hint: installHint}.Require(t, err)
	return b
}

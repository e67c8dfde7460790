// Package pyzmq gates the libzmq interop tests on Debian's python3 with
// python3-zmq and python3-msgpack, the independent peer those tests drive.
//
// Without them a developer's run skips the tests with a loud message, but a
// CI run (environment variable CI non-empty) fails: the README promises that
// CI runs them, and a silent skip there would leave the wire format with
// vLLM's real libzmq untested while the run stays green.
package pyzmq

import (
	"fmt"
	"os"
	"os/exec"
	"sync"
	"testing"

	"github.com/llmgw/caddy-llmgw/internal/testutil/testdep"
)

// Python is the interpreter the interop tests run: Debian's, whose
// python3-zmq and python3-msgpack packages ./xcaddy.sh test installs.
const Python = "/usr/bin/python3"

// installHint is how to get the peer.
const installHint = "apt-get install python3-zmq python3-msgpack"

// probe reports whether Python can import zmq and msgpack, once per test
// binary: every interop test asks, and starting Python costs ~50 ms.
var probe = sync.OnceValue(func() error {
	if _, err := os.Stat(Python); err != nil {
		return err
	}
	out, err := exec.Command(Python, "-c", "import zmq, msgpack").CombinedOutput()
	if err != nil {
		return fmt.Errorf("%v: %s", err, out)
	}
	return nil
})

// Require returns Python if it can import zmq and msgpack. Otherwise it
// fails the test under CI and skips it loudly elsewhere (testdep).
func Require(t testing.TB) string {
	t.Helper()
	testdep.Dep{What: "libzmq interop peer (" + Python + " with zmq and msgpack)", Hint: installHint}.Require(t, probe())
	return Python
}

//go:build linux

package tcplisten

import (
	"context"
	"net"
	"syscall"
	"testing"
	"time"
)

// soReusePort is SO_REUSEPORT on Linux, which package syscall does not name.
const soReusePort = 0xf

// reusePort listens on addr with SO_REUSEPORT, as Caddy does on Linux.
func reusePort(t *testing.T, addr string) net.Listener {
	t.Helper()
	lc := net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		err := c.Control(func(fd uintptr) { serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, soReusePort, 1) })
		if err != nil {
			return err
		}
		return serr
	}}
	ln, err := lc.Listen(context.Background(), "tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln
}

// countOK: the port's listeners can be counted, and none is there.
func countOK(port int) bool {
	n, ok, err := Count(port)
	return ok && err == nil && n == 0
}

// TestCountAndWaitOne: two sockets sharing a port are both counted, as
// a reload leaves them for a moment; WaitOne waits for the old one to
// close, and gives up with an error when it does not, or when nothing
// listens yet.
func TestCountAndWaitOne(t *testing.T) {
	first := reusePort(t, "127.0.0.1:0")
	port := first.Addr().(*net.TCPAddr).Port
	if _, ok, err := Count(port); err != nil || !ok {
		t.Skipf("no /proc/net/tcp here (%v)", err)
	}
	reusePort(t, first.Addr().String())
	if n, _, err := Count(port); err != nil || n != 2 {
		t.Fatalf("two listeners: counted %d, %v", n, err)
	}

	short, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if err := WaitOne(short, port); err == nil {
		t.Fatal("WaitOne returned with two listeners open")
	}
	if err := WaitOne(short, port+1); err == nil && countOK(port+1) {
		t.Fatal("WaitOne returned with no listener on the port")
	}

	first.Close()
	ctx, cancel2 := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel2()
	if err := WaitOne(ctx, port); err != nil {
		t.Fatal(err)
	}
	if n, _, err := Count(port); err != nil || n != 1 {
		t.Fatalf("one listener: counted %d, %v", n, err)
	}
	// A port nothing listens on counts none, and a connected socket on the
	// listener's port (the accepted side) is not a listener.
	conn, err := net.Dial("tcp", first.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if n, _, _ := Count(port); n != 1 {
		t.Errorf("with a connection open: counted %d listeners", n)
	}
}

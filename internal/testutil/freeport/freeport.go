// Package freeport picks TCP ports for tests that must name a port before
// they start a server (an engine process, a ZeroMQ endpoint, Caddy's
// listeners).
package freeport

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
)

// Port returns a TCP port that nothing listens on, on any interface or,
// when hosts are given, on each of them (IP addresses).
//
// The port is free when probed, not reserved: whoever binds it later may
// find it taken, and should retry with another. Ports from listening on
// :0 would come from the kernel's ephemeral range, which is where it also
// picks every other :0 listener and the local port of every outgoing
// connection of every process — and the tests of other packages, running
// in parallel, open thousands. So the port is drawn at random from below
// that range, where no port is ever assigned implicitly: it stays free
// until someone names it, as a test that closes a server and starts it
// again on the same address needs.
func Port(hosts ...string) (int, error) {
	if len(hosts) == 0 {
		hosts = []string{""}
	}
	lo, hi := 10000, ephemeralLow()
	for range 100 {
		port := lo + rand.IntN(hi-lo)
		held := make([]net.Listener, 0, len(hosts))
		for _, h := range hosts {
			ln, err := net.Listen("tcp", net.JoinHostPort(h, strconv.Itoa(port)))
			if err != nil {
				break
			}
			held = append(held, ln)
		}
		for _, ln := range held {
			ln.Close()
		}
		if len(held) == len(hosts) {
			return port, nil
		}
	}
	return 0, fmt.Errorf("no TCP port in [%d, %d) free on %q", lo, hi, hosts)
}

// ephemeralLow is the first port of Linux's ephemeral range (32768 where
// it cannot be read).
func ephemeralLow() int {
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if v, err := strconv.Atoi(f[0]); err == nil && v > 11000 {
				return v
			}
		}
	}
	return 32768
}

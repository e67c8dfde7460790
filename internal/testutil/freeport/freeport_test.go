package freeport

import (
	"net"
	"strconv"
	"testing"
)

func TestPortIsFreeBelowTheEphemeralRange(t *testing.T) {
	port, err := Port("127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	if port < 10000 || port >= ephemeralLow() {
		t.Fatalf("port %d outside [10000, %d)", port, ephemeralLow())
	}
	ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err != nil {
		t.Fatalf("the port handed out is not free: %v", err)
	}
	ln.Close()
}

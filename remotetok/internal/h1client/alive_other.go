//go:build !unix

package h1client

import "net"

// connAlive cannot peek at a socket here: an idle connection the peer
// closed is found when a call fails on it before any response, and the
// call is made again on a new one.
func connAlive(net.Conn) bool { return true }

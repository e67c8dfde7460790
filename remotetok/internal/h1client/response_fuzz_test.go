package h1client

import (
	"bufio"
	"bytes"
	"io"
	"testing"
)

// FuzzReadResponse: any bytes from an engine are read without a panic or
// a hang, and a body the client would reuse the connection after was
// read exactly as its head framed it.
func FuzzReadResponse(f *testing.F) {
	for _, seed := range []string{
		"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello",
		"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nhel\r\n2;x=1\r\nlo\r\n0\r\nT: 1\r\n\r\n",
		"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 204 No Content\r\n\r\n",
		"HTTP/1.0 200 OK\r\n\r\nuntil the end",
		"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok",
		"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nffffffffffffffff\r\n",
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		br := bufio.NewReaderSize(bytes.NewReader(data), 4<<10)
		resp, rb, err := readResponse(br, 16<<10)
		if err != nil {
			return
		}
		n, _ := io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
		if rb.finished() && resp.ContentLength >= 0 && n != resp.ContentLength {
			t.Fatalf("finished after %d bytes of a %d-byte body", n, resp.ContentLength)
		}
	})
}

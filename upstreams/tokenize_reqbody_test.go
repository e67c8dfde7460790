package upstreams

import (
	"errors"
	"io"
	"testing"
)

// TestSharedBodyUsers: the buffer goes back only when its maker and every
// reader are done; a closed reader reads nothing; no reader is handed out
// once every user is gone.
func TestSharedBodyUsers(t *testing.T) {
	s := newSharedBody(func(b []byte) []byte { return append(b, "hello"...) })
	r1, err := s.reader()
	if err != nil {
		t.Fatal(err)
	}
	s.release() // the maker is done; r1 still reads
	got, err := io.ReadAll(r1)
	if err != nil || string(got) != "hello" {
		t.Fatalf("read %q, %v", got, err)
	}
	r2, err := s.reader() // a retry's reader while r1 is open
	if err != nil {
		t.Fatal(err)
	}
	_ = r1.Close()
	_ = r1.Close() // twice: counted once
	if s.b == nil {
		t.Fatal("the buffer went back while a reader was open")
	}
	if _, err := r1.Read(make([]byte, 1)); !errors.Is(err, errBodyClosed) {
		t.Fatalf("a closed reader read: %v", err)
	}
	if got, _ := io.ReadAll(r2); string(got) != "hello" {
		t.Fatalf("second reader read %q", got)
	}
	_ = r2.Close()
	if s.b != nil {
		t.Fatal("the buffer did not go back once every user was done")
	}
	if _, err := s.reader(); !errors.Is(err, errBodyClosed) {
		t.Fatalf("a reader after every user was gone: %v", err)
	}
}

package readahead

import (
	"bytes"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// failingReader yields its data, then err.
type failingReader struct {
	r   io.Reader
	err error
}

func (f *failingReader) Read(p []byte) (int, error) {
	n, err := f.r.Read(p)
	if err == io.EOF {
		return n, f.err
	}
	return n, err
}

func TestBody(t *testing.T) {
	boom := errors.New("boom")
	for _, tc := range []struct {
		name          string
		body          string
		limit, length int64
		srcErr        error
		wantRead      int   // bytes read ahead
		wantErr       error // why reading stopped
	}{
		{name: "whole body, length known", body: "hello", limit: 10, length: 5, wantRead: 5, wantErr: io.EOF},
		{name: "whole body, length unknown", body: strings.Repeat("x", 3000), limit: 5000, length: -1, wantRead: 3000, wantErr: io.EOF},
		{name: "stops at the limit", body: strings.Repeat("y", 100), limit: 10, length: 100, wantRead: 10},
		{name: "read error", body: "abc", limit: 10, length: -1, srcErr: boom, wantRead: 3, wantErr: boom},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var src io.Reader = strings.NewReader(tc.body)
			if tc.srcErr != nil {
				src = &failingReader{r: src, err: tc.srcErr}
			}
			b := New(io.NopCloser(src), tc.limit, tc.length)
			select {
			case <-b.Done():
			case <-time.After(10 * time.Second):
				t.Fatal("reading never stopped")
			}
			got, err := b.Result()
			if len(got) != tc.wantRead || !errors.Is(err, tc.wantErr) && err != tc.wantErr {
				t.Fatalf("read ahead %d bytes, err %v; want %d, %v", len(got), err, tc.wantRead, tc.wantErr)
			}
			if b.Buffered() != tc.wantRead {
				t.Errorf("Buffered %d, want %d", b.Buffered(), tc.wantRead)
			}
			all, err := io.ReadAll(b)
			if tc.srcErr == nil && (err != nil || string(all) != tc.body) {
				t.Errorf("Read gave %d bytes, err %v; want the whole body of %d", len(all), err, len(tc.body))
			}
		})
	}
}

// TestBodyStalledClient: a source that stalls keeps Done open; what
// arrived reads at once, and Close wakes a Read waiting for more.
func TestBodyStalledClient(t *testing.T) {
	pr, pw := io.Pipe()
	defer pw.Close()
	b := New(pr, 1<<20, -1)
	if _, err := pw.Write([]byte("half")); err != nil {
		t.Fatal(err)
	}
	p := make([]byte, 16)
	n, err := b.Read(p)
	if err != nil || string(p[:n]) != "half" {
		t.Fatalf("Read %q, %v", p[:n], err)
	}
	select {
	case <-b.Done():
		t.Fatal("done while the client stalls")
	default:
	}
	res := make(chan error, 1)
	go func() {
		_, err := b.Read(p)
		res <- err
	}()
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-res:
		if !errors.Is(err, http.ErrBodyReadAfterClose) {
			t.Fatalf("Read after Close: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not wake the waiting Read")
	}
	pw.CloseWithError(errors.New("client gone")) // the server closes the source; the goroutine stops
	<-b.Done()
}

func TestBodyAllocatesNoMoreThanArrives(t *testing.T) {
	// A header declaring a huge body must not make the reader hold it.
	b := New(io.NopCloser(bytes.NewReader([]byte("tiny"))), 1<<30, 1<<30)
	got, _ := b.Result()
	if cap(got) > prealloc {
		t.Fatalf("allocated %d bytes for a 4-byte body", cap(got))
	}
}

// chunkedReader hands out its data in reads of the sizes given, cycling,
// as a client's body arrives in packets.
type chunkedReader struct {
	data  []byte
	sizes []byte
	i     int
}

func (c *chunkedReader) Read(p []byte) (int, error) {
	if len(c.data) == 0 {
		return 0, io.EOF
	}
	n := 1 + int(c.sizes[c.i%len(c.sizes)])
	c.i++
	n = min(n, len(p), len(c.data))
	copy(p, c.data[:n])
	c.data = c.data[n:]
	return n, nil
}

func (c *chunkedReader) Close() error { return nil }

// FuzzBody: whatever the body, the limit, the declared length and the way
// the bytes arrive, Result holds the body's first min(limit, len) bytes
// (io.EOF when that was all of it), and reading the Body, in reads of any
// size, yields the body byte for byte: what the upstream gets.
func FuzzBody(f *testing.F) {
	f.Add([]byte(`{"model":"m","prompt":"text"}`), int64(8), int64(-1), []byte{3, 0, 7}, uint8(5))
	f.Add([]byte("x"), int64(1), int64(1), []byte{0}, uint8(0))
	f.Add([]byte{}, int64(4), int64(0), []byte{1}, uint8(1))
	f.Fuzz(func(t *testing.T, body []byte, limit, declared int64, sizes []byte, readSize uint8) {
		if limit <= 0 || limit > 1<<20 {
			limit = 1 << 10
		}
		if declared < -1 || declared > 1<<20 {
			declared = -1
		}
		if len(sizes) == 0 {
			sizes = []byte{0}
		}
		b := New(&chunkedReader{data: body, sizes: sizes}, limit, declared)
		got, err := b.Result()
		want := body[:min(int64(len(body)), limit)]
		if !bytes.Equal(got, want) {
			t.Fatalf("Result %q, want the first %d bytes %q", got, len(want), want)
		}
		if int64(len(body)) < limit && err != io.EOF {
			t.Fatalf("Result error %v for a body shorter than the limit, want io.EOF", err)
		}
		var all []byte
		p := make([]byte, 1+int(readSize))
		for {
			n, err := b.Read(p)
			all = append(all, p[:n]...)
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
		}
		if !bytes.Equal(all, body) {
			t.Fatalf("read %q, want the body %q", all, body)
		}
	})
}

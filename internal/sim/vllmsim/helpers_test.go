package vllmsim

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/llmgw/caddy-llmgw/internal/zmtp"
	"github.com/llmgw/caddy-llmgw/kvindex"
	"github.com/vmihailenco/msgpack/v5"
)

func startEngine(t testing.TB, cfg Config) *Engine {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	e, err := Start(ctx, cfg)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(func() {
		if err := e.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return e
}

func newClient(t testing.TB) *http.Client {
	tr := &http.Transport{MaxIdleConnsPerHost: 64}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 60 * time.Second}
}

func postJSON(t testing.TB, c *http.Client, url string, body any) (int, []byte) {
	t.Helper()
	b, err := json.Marshal(body)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := c.Post(url, "application/json", bytes.NewReader(b))
	if err != nil {
		t.Fatalf("POST %s: %v", url, err)
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("POST %s: read: %v", url, err)
	}
	return resp.StatusCode, out
}

// testSub is a minimal SUB client on a raw connection: internal/zmtp's
// handshake and reader; each message goes to msgs.
type testSub struct {
	c    net.Conn
	msgs chan [][]byte
	done chan struct{}
}

func dialSub(t testing.TB, ep, topic string) *testSub {
	t.Helper()
	e, err := parseEndpoint(ep, "127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	c, err := net.DialTimeout(e.network, e.addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	g, err := handshake(context.Background(), c, zmtp.Sub)
	if err != nil {
		c.Close()
		t.Fatal(err)
	}
	if _, err := c.Write(zmtp.AppendMessage(nil, append([]byte{1}, topic...))); err != nil {
		t.Fatal(err)
	}
	s := &testSub{c: c, msgs: make(chan [][]byte, 4096), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		defer close(s.msgs)
		for {
			frames, isCmd, err := readMsg(g)
			if err != nil {
				return
			}
			if !isCmd {
				s.msgs <- frames
			}
		}
	}()
	t.Cleanup(func() { c.Close(); <-s.done })
	return s
}

func (s *testSub) next(t testing.TB, timeout time.Duration) [][]byte {
	t.Helper()
	select {
	case m, ok := <-s.msgs:
		if !ok {
			t.Fatal("subscriber connection closed")
		}
		return m
	case <-time.After(timeout):
		t.Fatalf("no KV event batch within %v", timeout)
	}
	return nil
}

// decodedBatch is a generically decoded batch.
type decodedBatch struct {
	ts     float64
	events []any
	rank   int64
}

func decodeBatch(t testing.TB, payload []byte) decodedBatch {
	t.Helper()
	var v []any
	if err := msgpack.Unmarshal(payload, &v); err != nil {
		t.Fatalf("decode batch: %v", err)
	}
	if len(v) != 3 {
		t.Fatalf("batch has %d elements, want 3", len(v))
	}
	ts, ok := v[0].(float64)
	if !ok {
		t.Fatalf("ts is %T", v[0])
	}
	evs, ok := v[1].([]any)
	if !ok {
		t.Fatalf("events is %T", v[1])
	}
	return decodedBatch{ts: ts, events: evs, rank: toInt(v[2])}
}

func toInt(v any) int64 {
	switch x := v.(type) {
	case int8:
		return int64(x)
	case int16:
		return int64(x)
	case int32:
		return int64(x)
	case int64:
		return x
	case uint8:
		return int64(x)
	case uint16:
		return int64(x)
	case uint32:
		return int64(x)
	case uint64:
		return int64(x)
	}
	panic(fmt.Sprintf("not an int: %T", v))
}

// storedEvent is a BlockStored/BlockRemoved/AllBlocksCleared in a neutral form.
type simpleEvent struct {
	typ      string
	hashes   []any // uint64 or []byte
	parent   any
	tokens   []uint64
	bs       int64
	loraID   any // nil or an integer
	loraName any // nil or a string
	extra    []any
	nfields  int
}

func asEvent(t testing.TB, v any, mapEvents bool) simpleEvent {
	t.Helper()
	var ev simpleEvent
	get := func(i int, key string) any { return nil }
	if mapEvents {
		m, ok := v.(map[string]any)
		if !ok {
			t.Fatalf("event is %T, want map", v)
		}
		ev.nfields = len(m)
		get = func(_ int, key string) any { return m[key] }
		ev.typ, _ = m["type"].(string)
	} else {
		a, ok := v.([]any)
		if !ok {
			t.Fatalf("event is %T, want array", v)
		}
		ev.nfields = len(a)
		ev.typ, _ = a[0].(string)
		get = func(i int, _ string) any {
			if i < len(a) {
				return a[i]
			}
			return nil
		}
	}
	switch ev.typ {
	case "BlockStored":
		ev.hashes, _ = get(1, "block_hashes").([]any)
		ev.parent = get(2, "parent_block_hash")
		toks, _ := get(3, "token_ids").([]any)
		for _, x := range toks {
			ev.tokens = append(ev.tokens, uint64(toInt(x)))
		}
		ev.bs = toInt(get(4, "block_size"))
		ev.loraID = get(5, "lora_id")
		ev.loraName = get(7, "lora_name")
		ev.extra, _ = get(8, "extra_keys").([]any)
	case "BlockRemoved":
		ev.hashes, _ = get(1, "block_hashes").([]any)
	}
	return ev
}

func hashU64(t testing.TB, v any) uint64 {
	t.Helper()
	switch x := v.(type) {
	case []byte:
		if len(x) != 32 {
			t.Fatalf("bytes hash of %d bytes", len(x))
		}
		return uint64(x[24])<<56 | uint64(x[25])<<48 | uint64(x[26])<<40 | uint64(x[27])<<32 | uint64(x[28])<<24 | uint64(x[29])<<16 | uint64(x[30])<<8 | uint64(x[31])
	default:
		return uint64(toInt(v))
	}
}

func kvindexHasher(cfg Config) (*kvindex.Hasher, error) {
	return kvindex.NewHasher(cfg.HashSeed, cfg.BlockSize)
}

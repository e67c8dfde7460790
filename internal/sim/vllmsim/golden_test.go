package vllmsim

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"reflect"
	"testing"
	"time"

	"github.com/llmgw/caddy-llmgw/internal/testutil/golden"
	"github.com/llmgw/caddy-llmgw/kvindex"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func goldenDigests(ds [][32]byte) []kvindex.Digest {
	out := make([]kvindex.Digest, len(ds))
	for i, d := range ds {
		out[i] = kvindex.Digest(d)
	}
	return out
}

// TestEncodeMatchesGoldenPayloads builds the events of vLLM's golden
// payloads and compares the encoder's bytes with msgspec's.
func TestEncodeMatchesGoldenPayloads(t *testing.T) {
	g := golden.Load(t)
	ds := goldenDigests(g.HashCases[0].BlockHashes) // bs16_seed0_32tok
	toks := make([]uint64, 32)
	for i := range toks {
		toks[i] = uint64(i)
	}
	storedRemovedCleared := []kvEvent{
		{kind: evStored, hashes: ds, tokens: toks, blockSize: 16},
		{kind: evRemoved, hashes: ds[1:2]},
		{kind: evCleared},
	}
	secondBlock := []kvEvent{
		{kind: evStored, hashes: ds[1:2], hasParent: true, parent: ds[0], tokens: toks[16:], blockSize: 16},
	}
	var loraCase [][32]byte
	for _, hc := range g.HashCases {
		if hc.Name == "bs16_seed0_lora_and_salt" {
			loraCase = hc.BlockHashes
		}
	}
	if len(loraCase) < 2 {
		t.Fatal("golden hash case bs16_seed0_lora_and_salt missing")
	}
	first, rest := kvindex.RequestBlockExtraKeys("sql-adapter", "tenant-a")
	loraSalt := []kvEvent{
		{kind: evStored, hashes: goldenDigests(loraCase[:2]), tokens: toks, blockSize: 16,
			extraFirst: first, extraRest: rest, loraName: "sql-adapter", loraID: 1},
	}
	cases := []struct {
		golden      string
		mapEvents   bool
		bytesHashes bool
		events      []kvEvent
	}{
		{"map_pr42892_stored_removed_cleared", true, false, storedRemovedCleared},
		{"array_pr40984_stored_removed_cleared", false, false, storedRemovedCleared},
		{"map_bytes_hashes_env0_second_block", true, true, secondBlock},
		{"map_lora_salt_extra_keys", true, false, loraSalt},
	}
	payloads := map[string]string{}
	for _, p := range g.Payloads {
		payloads[p.Name] = p.PayloadHex
	}
	for _, tc := range cases {
		t.Run(tc.golden, func(t *testing.T) {
			want, ok := payloads[tc.golden]
			if !ok {
				t.Fatalf("golden payload %q missing", tc.golden)
			}
			enc := newEventEncoder(tc.mapEvents, tc.bytesHashes)
			got := hex.EncodeToString(enc.encodeBatch(1760000000.25, tc.events, 0))
			if got != want {
				t.Fatalf("payload mismatch\n got %s\nwant %s", got, want)
			}
		})
	}
}

// TestZMQFramesGolden publishes a golden payload at the golden topic and
// sequence number through the simulator's own publisher and compares the
// bytes on the wire with the ZMTP encoding of vLLM's golden frames; then it
// sends the replay ROUTER the golden replay request and compares the reply,
// end marker included, in both reply layouts.
func TestZMQFramesGolden(t *testing.T) {
	g := golden.Load(t)
	z := g.ZMQ
	payload := g.Payloads[0].Payload // over 255 bytes: a long frame
	for _, legacy := range []bool{false, true} {
		t.Run(fmt.Sprintf("legacy=%v", legacy), func(t *testing.T) {
			e := startEngine(t, Config{TimeScale: 100, KVEvents: &KVEventsConfig{
				Endpoint: "tcp://127.0.0.1:0", ReplayEndpoint: "tcp://127.0.0.1:0", Topic: z.Topic, LegacyReplayLayout: legacy,
			}})
			sub := dialRaw(t, e.KVEndpoint(), "SUB")
			// A subscription to the whole topic: flags 0, length, 0x01 topic.
			writeRaw(t, sub, append([]byte{0, byte(1 + len(z.Topic)), 1}, z.Topic...))
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := e.WaitKVSubscribers(ctx, 1); err != nil {
				t.Fatal(err)
			}
			e.SetFaults(Faults{SeqGap: int(z.Seq)}) // the next batch is seq z.Seq
			e.mu.Lock()
			pub := e.pub
			e.mu.Unlock()
			if seq := pub.publish(payload); seq != z.Seq {
				t.Fatalf("published seq %d, want %d", seq, z.Seq)
			}
			wantWire(t, sub, "PUB message", zmtpWire(z.Frame0, z.Frame1, payload))

			dealer := dialRaw(t, e.ReplayEndpoint(), "DEALER")
			writeRaw(t, dealer, zmtpWire(z.ReplayRequest...))
			if start := binary.BigEndian.Uint64(z.ReplayRequest[1]); start > z.Seq {
				t.Fatalf("golden replay starts at %d, after the seq %d published", start, z.Seq)
			}
			reply, end := zmtpWire(nil, z.Frame0, z.Frame1, payload), zmtpWire(nil, nil, z.EndSeq, nil)
			if legacy {
				reply, end = zmtpWire(nil, z.Frame1, payload), zmtpWire(nil, z.EndSeq, nil)
			}
			wantWire(t, dealer, "replayed batch", reply)
			wantWire(t, dealer, "replay end marker", end)
		})
	}
}

// zmtpWire is the ZMTP 3.0 encoding of a multipart message, written from
// the spec rather than with the simulator's appendFrames: flags (0x01 more,
// 0x02 long), then a 1-byte or 8-byte big-endian size, then the body.
func zmtpWire(frames ...[]byte) []byte {
	var out []byte
	for i, f := range frames {
		more := byte(0)
		if i < len(frames)-1 {
			more = 1
		}
		if len(f) <= 255 {
			out = append(out, more, byte(len(f)))
		} else {
			out = binary.BigEndian.AppendUint64(append(out, more|2), uint64(len(f)))
		}
		out = append(out, f...)
	}
	return out
}

// rawPeer is a connection past the ZMTP handshake, read byte for byte.
type rawPeer struct {
	c net.Conn
	r io.Reader
}

// dialRaw connects and completes the ZMTP 3.0 NULL handshake as sockType,
// written from the spec rather than with internal/zmtp: the 64-byte
// greeting (signature 0xff, 8 padding bytes, 0x7f; version 3.0; mechanism
// "NULL"; as-server 0), then a READY command (flags 0x04) with the
// Socket-Type property; the peer's greeting and READY are read exactly, so
// nothing after them is consumed.
func dialRaw(t *testing.T, ep string, sockType string) rawPeer {
	t.Helper()
	e, err := parseEndpoint(ep, "127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	c, err := net.DialTimeout(e.network, e.addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	greeting := make([]byte, 64)
	greeting[0], greeting[9], greeting[10] = 0xff, 0x7f, 3
	copy(greeting[12:], "NULL")
	ready := append([]byte("\x05READY\x0bSocket-Type"), 0, 0, 0, byte(len(sockType)))
	ready = append(ready, sockType...)
	if _, err := c.Write(append(append(greeting, 0x04, byte(len(ready))), ready...)); err != nil {
		t.Fatal(err)
	}
	peer := make([]byte, 64+2)
	if _, err := io.ReadFull(c, peer); err != nil {
		t.Fatalf("handshake: %v", err)
	}
	if peer[0] != 0xff || peer[9] != 0x7f || peer[64] != 0x04 {
		t.Fatalf("handshake: greeting %x, READY header %x", peer[:64], peer[64:])
	}
	body := make([]byte, peer[65])
	if _, err := io.ReadFull(c, body); err != nil || !bytes.HasPrefix(body, []byte("\x05READY")) {
		t.Fatalf("handshake: READY %q, %v", body, err)
	}
	_ = c.SetDeadline(time.Time{})
	return rawPeer{c: c, r: c}
}

func writeRaw(t *testing.T, p rawPeer, b []byte) {
	t.Helper()
	if _, err := p.c.Write(b); err != nil {
		t.Fatal(err)
	}
}

// wantWire reads len(want) bytes and compares them with want. The deadline
// only keeps a missing reply from hanging the test.
func wantWire(t *testing.T, p rawPeer, what string, want []byte) {
	t.Helper()
	_ = p.c.SetReadDeadline(time.Now().Add(10 * time.Second))
	got := make([]byte, len(want))
	if n, err := io.ReadFull(p.r, got); err != nil {
		t.Fatalf("%s: read %d of %d bytes: %v (got %x)", what, n, len(want), err, got[:n])
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("%s on the wire:\n got %x\nwant %x", what, got, want)
	}
}

// TestAnnouncedHashesMatchGolden sends the golden token ids to the engine
// and checks the BlockStored events it publishes, in every wire shape.
func TestAnnouncedHashesMatchGolden(t *testing.T) {
	g := golden.Load(t)
	for _, gc := range g.HashCases {
		if gc.Name != "bs16_seed0_32tok" && gc.Name != "bs64_seed1234_long300" && gc.Name != "bs16_seed0_cache_salt" && gc.Name != "bs16_seed0_lora_and_salt" {
			continue
		}
		// The golden extra keys of block 0 are [salt] or [lora, salt].
		var lora, salt string
		if len(gc.ExtraKeys) > 0 && gc.ExtraKeys[0] != nil {
			k := gc.ExtraKeys[0]
			salt = k[len(k)-1].(string)
			if len(k) == 2 {
				lora = k[0].(string)
			}
		}
		for _, shape := range []struct {
			name               string
			mapEvents, bytesHs bool
		}{{"array-int", false, false}, {"map-int", true, false}, {"array-bytes", false, true}, {"map-bytes", true, true}} {
			t.Run(gc.Name+"/"+shape.name, func(t *testing.T) {
				cfg := Config{
					BlockSize: gc.BlockSize, HashSeed: gc.Seed, TimeScale: 100, DPRank: 3,
					KVEvents: &KVEventsConfig{Endpoint: "tcp://127.0.0.1:0", Topic: "kv@sim", MapEvents: shape.mapEvents, BytesHashes: shape.bytesHs},
				}
				if lora != "" {
					cfg.LoRAModules = []string{"other-adapter", lora}
				}
				e := startEngine(t, cfg)
				sub := dialSub(t, e.KVEndpoint(), "kv@")
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				if err := e.WaitKVSubscribers(ctx, 1); err != nil {
					t.Fatal(err)
				}
				body := map[string]any{"prompt": gc.Tokens, "max_tokens": 1}
				if salt != "" {
					body["cache_salt"] = salt
				}
				if lora != "" {
					body["model"] = lora
				}
				status, out := postJSON(t, newClient(t), e.URL()+"/v1/completions", body)
				if status != 200 {
					t.Fatalf("status %d: %s", status, out)
				}
				msg := sub.next(t, 10*time.Second)
				if len(msg) != 3 || string(msg[0]) != "kv@sim" || len(msg[1]) != 8 {
					t.Fatalf("frames %q", msg[:min(len(msg), 2)])
				}
				if seq := binary.BigEndian.Uint64(msg[1]); seq != 0 {
					t.Errorf("first seq %d, want 0", seq)
				}
				b := decodeBatch(t, msg[2])
				if b.rank != 3 {
					t.Errorf("dp rank %d, want 3", b.rank)
				}
				if d := time.Since(time.Unix(0, int64(b.ts*1e9))); d < 0 || d > time.Minute {
					t.Errorf("ts %v is not now", b.ts)
				}
				if len(b.events) != 1 {
					t.Fatalf("%d events, want 1", len(b.events))
				}
				ev := asEvent(t, b.events[0], shape.mapEvents)
				wantFields := 12
				if shape.mapEvents {
					wantFields = 11
				}
				if ev.typ != "BlockStored" || ev.nfields != wantFields {
					t.Fatalf("event %s with %d fields", ev.typ, ev.nfields)
				}
				if ev.parent != nil {
					t.Errorf("parent %v, want nil", ev.parent)
				}
				nFull := len(gc.Tokens) / gc.BlockSize
				if len(ev.hashes) != nFull || len(gc.BlockHashesUint64) != nFull {
					t.Fatalf("%d hashes, want %d", len(ev.hashes), nFull)
				}
				for i, h := range ev.hashes {
					if shape.bytesHs {
						bh, ok := h.([]byte)
						if !ok || hex.EncodeToString(bh) != gc.BlockHashesHex[i] {
							t.Errorf("hash %d = %x, want %s", i, h, gc.BlockHashesHex[i])
						}
					} else if got := hashU64(t, h); got != gc.BlockHashesUint64[i] {
						t.Errorf("hash %d = %d, want %d", i, got, gc.BlockHashesUint64[i])
					}
				}
				if len(ev.tokens) != nFull*gc.BlockSize {
					t.Fatalf("%d token ids, want %d", len(ev.tokens), nFull*gc.BlockSize)
				}
				for i, tok := range ev.tokens {
					if tok != gc.Tokens[i] {
						t.Fatalf("token %d = %d, want %d", i, tok, gc.Tokens[i])
					}
				}
				if ev.bs != int64(gc.BlockSize) {
					t.Errorf("block_size %d", ev.bs)
				}
				if lora == "" && (ev.loraID != nil || ev.loraName != nil) {
					t.Errorf("lora_id %v lora_name %v, want nil", ev.loraID, ev.loraName)
				}
				if lora != "" && (ev.loraID == nil || toInt(ev.loraID) != 2 || ev.loraName != lora) {
					t.Errorf("lora_id %v lora_name %v, want 2 %q", ev.loraID, ev.loraName, lora)
				}
				if len(ev.extra) != nFull {
					t.Fatalf("extra_keys has %d entries, want %d", len(ev.extra), nFull)
				}
				for i, x := range ev.extra {
					var want []any
					if i < len(gc.ExtraKeys) {
						want = gc.ExtraKeys[i]
					}
					if got, _ := x.([]any); (x == nil) != (want == nil) || !reflect.DeepEqual(got, want) {
						t.Errorf("extra_keys[%d] = %v, want %v", i, x, want)
					}
				}
			})
		}
	}
}

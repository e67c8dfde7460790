// Package golden is the repository's one copy of vllm_golden.json and its
// one loader, shared by the kvindex and vllmsim tests.
//
// The vectors were computed outside this repository by an independent
// Python reference (cbor2, hashlib, msgpack) and cross-checked against
// vLLM itself (see File.CrossChecks); the tests compare this module's
// hashing, event encoding and decoding, and ZMQ framing with them byte for
// byte.
//
// Many numbers in the file are 64-bit block hashes above 2^53, which a
// float64 cannot hold: typed fields decode them as uint64, and the
// free-form parts (extra keys, decoded payloads) are read with
// json.Decoder.UseNumber, never through float64.
package golden

import (
	"bytes"
	_ "embed"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"testing"
)

//go:embed vllm_golden.json
var raw []byte

// File is the parsed vllm_golden.json.
type File struct {
	Generator   string     `json:"generator"`
	CrossChecks []string   `json:"cross_checks"`
	HashCases   []HashCase `json:"hash_cases"`
	Legacy      LegacyCase `json:"legacy_64bit_case"`
	Hybrid      HybridCase `json:"hybrid_case"`
	Payloads    []Payload  `json:"msgpack_payloads"`
	ZMQ         ZMQFrames  `json:"zmq_frames"`
}

// HashCase is one sha256_cbor request: its tokens and extra keys, and the
// NONE_HASH, first block's CBOR and block hashes vLLM computes for them.
type HashCase struct {
	Name      string   `json:"name"`
	Note      string   `json:"note"`
	Algo      string   `json:"algo"`
	BlockSize int      `json:"block_size"`
	Seed      string   `json:"seed"` // PYTHONHASHSEED, or vLLM's special values
	Tokens    []uint64 `json:"tokens"`
	// ExtraKeys holds one entry per block: nil for a block without extra
	// keys, else its tuple, with JSON arrays (Python tuples) as []any,
	// integers as int64 and strings as string. Nil when the case has none.
	ExtraKeys         [][]any  `json:"extra_keys"`
	NoneHashHex       string   `json:"none_hash_hex"`
	FirstBlockCBORHex string   `json:"first_block_cbor_hex"`
	BlockHashesHex    []string `json:"block_hashes_hex"`
	// BlockHashesUint64 are the hashes in vLLM's int event form: the last
	// 8 digest bytes, big-endian.
	BlockHashesUint64 []uint64 `json:"block_hashes_uint64"`
	// EventParentOfFirst is the parent_block_hash of the event announcing
	// block 0: always nil, block 0 has no parent.
	EventParentOfFirst any `json:"event_parent_of_first"`
	// BlockHashes are BlockHashesHex decoded.
	BlockHashes [][32]byte `json:"-"`
}

// LegacyCase is vLLM v0.10.0-v0.10.1's sha256_cbor_64bit, which chained
// the low 64 bits of each digest.
type LegacyCase struct {
	Name              string   `json:"name"`
	Note              string   `json:"note"`
	BlockSize         int      `json:"block_size"`
	Seed              string   `json:"seed"`
	Tokens            []uint64 `json:"tokens"`
	NoneHashUint64    uint64   `json:"none_hash_uint64"`
	BlockHashesUint64 []uint64 `json:"block_hashes_uint64"`
}

// HybridCase is a hybrid model's group hash: GroupBlockSize/HashBlockSize
// consecutive block digests concatenated.
type HybridCase struct {
	Name                   string   `json:"name"`
	HashBlockSize          int      `json:"hash_block_size"`
	GroupBlockSize         int      `json:"group_block_size"`
	Tokens                 []uint64 `json:"tokens"`
	GroupBlockHashesHex    []string `json:"group_block_hashes_hex"`
	GroupBlockHashesUint64 []uint64 `json:"group_block_hashes_uint64"`
}

// Payload is one msgspec-encoded EventBatch of some vLLM version.
type Payload struct {
	Name       string `json:"name"`
	Note       string `json:"note"`
	PayloadHex string `json:"payload_hex"`
	// Decoded is the reference's reading of the payload: [ts, events,
	// dp_rank?] with events as arrays or maps, {"bytes_hex": h} for a
	// msgpack bin, and every number a json.Number (hashes exceed what
	// float64 holds exactly).
	Decoded []any `json:"decoded"`
	// Payload is PayloadHex decoded.
	Payload []byte `json:"-"`
}

// ZMQFrames are the frames of one PUB message and of a replay exchange.
type ZMQFrames struct {
	Topic     string `json:"topic"`
	Seq       uint64 `json:"seq"`
	Frame0Hex string `json:"frame0_hex"` // topic
	Frame1Hex string `json:"frame1_hex"` // seq, 8 bytes big-endian
	// ReplayRequestHex is what a DEALER sends the replay ROUTER:
	// ["", start_seq].
	ReplayRequestHex []string `json:"replay_request_from_dealer_hex"`
	EndSeqHex        string   `json:"end_seq_hex"` // replay end marker
	// The same frames decoded.
	Frame0, Frame1, EndSeq []byte   `json:"-"`
	ReplayRequest          [][]byte `json:"-"`
}

// Parse decodes the embedded file afresh, so a test may modify what it
// gets without affecting others.
func Parse() (*File, error) {
	d := json.NewDecoder(bytes.NewReader(raw))
	d.UseNumber()
	d.DisallowUnknownFields()
	var f File
	if err := d.Decode(&f); err != nil {
		return nil, fmt.Errorf("golden: %w", err)
	}
	if err := f.decodeHex(); err != nil {
		return nil, fmt.Errorf("golden: %w", err)
	}
	for i := range f.HashCases {
		c := &f.HashCases[i]
		for j, tuple := range c.ExtraKeys {
			if tuple == nil {
				continue
			}
			v, err := ints(tuple)
			if err != nil {
				return nil, fmt.Errorf("golden: %s: extra keys of block %d: %w", c.Name, j, err)
			}
			c.ExtraKeys[j] = v.([]any)
		}
	}
	return &f, nil
}

// Load is Parse for a test: it fails t if the file does not parse.
func Load(t testing.TB) *File {
	t.Helper()
	f, err := Parse()
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// decodeHex fills the decoded byte fields from their hex strings.
func (f *File) decodeHex() error {
	var err error
	dec := func(what, h string) []byte {
		b, e := hex.DecodeString(h)
		if e != nil && err == nil {
			err = fmt.Errorf("%s: %w", what, e)
		}
		return b
	}
	for i := range f.HashCases {
		c := &f.HashCases[i]
		for j, h := range c.BlockHashesHex {
			b := dec(c.Name+" block hash", h)
			if len(b) != 32 {
				if err == nil {
					err = fmt.Errorf("%s: block hash %d has %d bytes, want 32", c.Name, j, len(b))
				}
				continue
			}
			c.BlockHashes = append(c.BlockHashes, [32]byte(b))
		}
	}
	for i := range f.Payloads {
		f.Payloads[i].Payload = dec(f.Payloads[i].Name, f.Payloads[i].PayloadHex)
	}
	z := &f.ZMQ
	z.Frame0, z.Frame1, z.EndSeq = dec("frame0", z.Frame0Hex), dec("frame1", z.Frame1Hex), dec("end seq", z.EndSeqHex)
	for _, h := range z.ReplayRequestHex {
		z.ReplayRequest = append(z.ReplayRequest, dec("replay request", h))
	}
	return err
}

// ints turns the json.Numbers of an extra-key value into int64: vLLM's
// extra keys hold ints (multimodal offsets, which may be negative), never
// floats.
func ints(v any) (any, error) {
	switch x := v.(type) {
	case json.Number:
		n, err := x.Int64()
		if err != nil {
			return nil, fmt.Errorf("number %s is not an int64", x)
		}
		return n, nil
	case []any:
		out := make([]any, len(x))
		for i := range x {
			var err error
			if out[i], err = ints(x[i]); err != nil {
				return nil, err
			}
		}
		return out, nil
	}
	return v, nil
}

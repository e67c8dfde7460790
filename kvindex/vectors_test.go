package kvindex

import (
	"encoding/hex"
	"encoding/json"
	"os"
	"testing"
)

// eventVectors is testdata/kv_event_vectors.json, written by
// kv_event_vectors.py with python3-msgpack: payloads of every event
// encoding the decoder accepts, with the fields expected of them.
type eventVectors struct {
	Generator string `json:"generator"`
	Vectors   []struct {
		Name       string        `json:"name"`
		PayloadHex string        `json:"payload_hex"`
		TS         float64       `json:"ts"`
		DPRank     *int          `json:"dp_rank"`
		Unknown    int           `json:"unknown"`
		Events     []vectorEvent `json:"events"`
	} `json:"vectors"`
}

// vectorEvent is one event's expected fields; absent ones are zero, nil
// pointers for the fields whose absence the Event marks (Has...).
type vectorEvent struct {
	Kind          string          `json:"kind"`
	BlockHashes   []uint64        `json:"block_hashes"`
	Parent        *uint64         `json:"parent"`
	TokenIDs      []uint64        `json:"token_ids"`
	BlockSize     int             `json:"block_size"`
	LoRAID        *int64          `json:"lora_id"`
	Medium        string          `json:"medium"`
	LoRAName      string          `json:"lora_name"`
	ExtraKeys     json.RawMessage `json:"extra_keys"`
	GroupIdx      int             `json:"group_idx"`
	SpecKind      string          `json:"spec_kind"`
	SlidingWindow int             `json:"sliding_window"`
	Locality      string          `json:"locality"`
}

func loadEventVectors(t testing.TB) eventVectors {
	t.Helper()
	raw, err := os.ReadFile("testdata/kv_event_vectors.json")
	if err != nil {
		t.Fatal(err)
	}
	var vs eventVectors
	if err := json.Unmarshal(raw, &vs); err != nil {
		t.Fatal(err)
	}
	return vs
}

// vectorPayloads are the payloads of kv_event_vectors.json, for fuzz seeds.
func vectorPayloads(t testing.TB) [][]byte {
	var out [][]byte
	for _, v := range loadEventVectors(t).Vectors {
		p, err := hex.DecodeString(v.PayloadHex)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, p)
	}
	return out
}

// TestDecodeEventVectors decodes each payload of kv_event_vectors.json and
// compares the batch with the vector's expected fields, one by one.
func TestDecodeEventVectors(t *testing.T) {
	vs := loadEventVectors(t)
	if len(vs.Vectors) < 16 {
		t.Fatalf("%d vectors, want 16", len(vs.Vectors))
	}
	for _, v := range vs.Vectors {
		t.Run(v.Name, func(t *testing.T) {
			p, err := hex.DecodeString(v.PayloadHex)
			if err != nil {
				t.Fatal(err)
			}
			b, err := DecodeBatch(p)
			if err != nil {
				t.Fatal(err)
			}
			if b.TS != v.TS || b.HasDPRank != (v.DPRank != nil) || v.DPRank != nil && b.DPRank != *v.DPRank {
				t.Errorf("ts %v rank %d/%v, want %v %v", b.TS, b.DPRank, b.HasDPRank, v.TS, v.DPRank)
			}
			if b.Unknown != v.Unknown || len(b.Events) != len(v.Events) {
				t.Fatalf("%d events, %d unknown; want %d, %d", len(b.Events), b.Unknown, len(v.Events), v.Unknown)
			}
			for i, w := range v.Events {
				checkVectorEvent(t, i, b.Events[i], w)
			}
		})
	}
}

func checkVectorEvent(t *testing.T, i int, got Event, w vectorEvent) {
	t.Helper()
	field := func(name string, g, want any) {
		if gs, ws := jsonOf(t, g), jsonOf(t, want); gs != ws {
			t.Errorf("event %d %s = %s, want %s", i, name, gs, ws)
		}
	}
	field("kind", got.Kind.String(), w.Kind)
	field("block_hashes", nonNil(got.BlockHashes), nonNil(w.BlockHashes))
	var parent *uint64
	if got.HasParent {
		parent = &got.Parent
	}
	field("parent", parent, w.Parent)
	field("token_ids", nonNil(got.TokenIDs), nonNil(w.TokenIDs))
	field("block_size", got.BlockSize, w.BlockSize)
	var lora *int64
	if got.HasLoRAID {
		lora = &got.LoRAID
	}
	field("lora_id", lora, w.LoRAID)
	field("medium", got.Medium, w.Medium)
	field("lora_name", got.LoRAName, w.LoRAName)
	field("extra_keys", got.ExtraKeys, w.ExtraKeys)
	field("group_idx", got.GroupIdx, w.GroupIdx)
	field("spec_kind", got.SpecKind, w.SpecKind)
	field("sliding_window", got.SlidingWindow, w.SlidingWindow)
	field("locality", got.Locality, w.Locality)
}

// jsonOf is v as compact JSON, so decoded values (uint64, string, nil,
// nested []any) compare with the vector's JSON exactly.
func jsonOf(t *testing.T, v any) string {
	if r, ok := v.(json.RawMessage); ok {
		var x any
		if err := json.Unmarshal(r, &x); err != nil {
			t.Fatal(err)
		}
		v = x
	}
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func nonNil(s []uint64) []uint64 {
	if s == nil {
		return []uint64{}
	}
	return s
}

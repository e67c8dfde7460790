package routing

import (
	"encoding/binary"
	"math"
	"testing"
)

// fuzzReader turns fuzz bytes into values; it yields zeros once exhausted.
type fuzzReader struct{ b []byte }

func (r *fuzzReader) u64() uint64 {
	var buf [8]byte
	n := copy(buf[:], r.b)
	r.b = r.b[n:]
	return binary.LittleEndian.Uint64(buf[:])
}

func (r *fuzzReader) byte() byte {
	if len(r.b) == 0 {
		return 0
	}
	c := r.b[0]
	r.b = r.b[1:]
	return c
}

// f64 mostly yields small plausible gauges, sometimes raw bit patterns
// (NaN, Inf, negatives, huge).
func (r *fuzzReader) f64() float64 {
	switch sel := r.byte(); sel % 4 {
	case 0:
		return math.Float64frombits(r.u64())
	case 1:
		return float64(r.byte()) / 255
	default:
		return float64(int8(r.byte()))
	}
}

func (r *fuzzReader) int() int { return int(int32(uint32(r.u64()))) }

func (r *fuzzReader) smallInt() int { return int(int8(r.byte())) }

func decodePickInput(data []byte) (Request, []Candidate, Config) {
	r := &fuzzReader{b: data}
	req := Request{PromptTokens: r.int(), BlockSize: r.smallInt(), TotalBlocks: r.smallInt(), Key: r.u64(), CacheKey: r.byte()&1 == 1}
	var cfg Config
	if r.byte()&1 == 1 {
		cfg = Config{
			PrefixWeight: r.f64(), ApproximateWeight: r.f64(), QueueWeight: r.f64(), RunningWeight: r.f64(),
			KVWeight: r.f64(), KVLimit: r.f64(), Epsilon: r.f64(), BoundedLoadMin: r.f64(),
			ImbalanceThreshold: r.f64(), TieTokens: r.f64(),
		}
	}
	n := int(r.byte() % 70)
	cands := make([]Candidate, n)
	dials := []string{"a:1", "b:1", "c:1", "d:1", "e:1", "a:1", ""}
	for i := range cands {
		flags := r.byte()
		c := Candidate{
			Dial:          dials[int(r.byte())%len(dials)],
			Tier:          Tier(int(r.byte()%6) - 1),
			MatchedBlocks: r.smallInt(),
			Running:       r.f64(),
			Waiting:       r.f64(),
			Inflight:      int64(r.smallInt()),
			Dispatched:    int64(r.smallInt()),
			KVUsage:       r.f64(),
			MaxInflight:   r.smallInt(),
			LoadKnown:     flags&1 == 1,
		}
		if flags&2 == 2 {
			c.Unavailable = "down"
		}
		if flags&4 == 4 {
			c.Inflight = int64(r.u64())
		}
		cands[i] = c
	}
	return req, cands, cfg
}

// FuzzPick: for any candidates, requests and configs, Pick does not panic,
// returns an index in range or -1, never picks an excluded candidate,
// returns -1 only when every candidate is excluded, agrees with its fast
// path, and reports finite, sane numbers.
func FuzzPick(f *testing.F) {
	f.Add([]byte{})
	f.Add([]byte("\xe8\x03\x00\x00\x00\x00\x00\x00\x10\x3e\x2a\x00\x00\x00\x00\x00\x00\x00\x00\x00\x04" +
		"\x01\x00\x00\x3c\x02\x02\x02\x00\x02\x00\x02\x00\x01\x00\x00" +
		"\x01\x01\x00\x00\x02\x00\x02\x00\x02\x00\x02\x00\x01\x00\x00"))
	f.Add([]byte("\xff\xff\xff\x7f\x00\x00\x00\x00\x00\x00\x01\xff\xff\xff\xff\xff\xff\xff\xff\x01" +
		"\x01\x00\x00\x00\x00\x00\x00\xf8\x7f\x00\x00\x00\x00\x00\x00\xf0\x7f\x03\xff\x02\xff\x01\x80\x00\xff\x02\x05\x02\x05\x02\xfb" +
		"\x40\x07\x02\x05\x01\x02\x03\x04\x05\x06\x07\x08\x09\x0a\x0b\x0c\x0d\x0e\x0f"))
	f.Fuzz(func(t *testing.T, data []byte) {
		req, cands, cfg := decodePickInput(data)
		d := Pick(req, cands, cfg, true)
		if d.Index < -1 || d.Index >= len(cands) {
			t.Fatalf("Index %d out of range for %d candidates", d.Index, len(cands))
		}
		if len(cands) > 0 && len(d.Scored) != len(cands) {
			t.Fatalf("%d scored for %d candidates", len(d.Scored), len(cands))
		}
		anyUsable := false
		for i, s := range d.Scored {
			if s.Excluded == "" {
				anyUsable = true
			}
			if math.IsNaN(s.Cost) || s.Cost < 0 || math.IsNaN(s.Load) || s.Load < 0 || !(s.Share >= 0 && s.Share <= 1) {
				t.Fatalf("Scored[%d] = %+v", i, s)
			}
			if s.MatchedBlocks < 0 {
				t.Fatalf("Scored[%d] negative match %+v", i, s)
			}
		}
		if d.Index >= 0 && d.Scored[d.Index].Excluded != "" {
			t.Fatalf("picked excluded candidate %d (%s)", d.Index, d.Scored[d.Index].Excluded)
		}
		if d.Index == -1 && anyUsable {
			t.Fatalf("returned -1 with a usable candidate: %+v", d.Scored)
		}
		if !(d.Share >= 0 && d.Share <= 1) {
			t.Fatalf("Share %v", d.Share)
		}
		fast := Pick(req, cands, cfg, false)
		if fast.Index != d.Index || fast.Outcome != d.Outcome || fast.Tier != d.Tier || fast.Share != d.Share {
			t.Fatalf("fast %+v != explained %+v", fast, d)
		}
		if i := LeastLoaded(cands); i < -1 || i >= len(cands) || (i >= 0 && cands[i].Unavailable != "") {
			t.Fatalf("LeastLoaded = %d", i)
		}
	})
}

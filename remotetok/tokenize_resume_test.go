package remotetok

import (
	"bytes"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"

	"github.com/llmgw/caddy-llmgw/internal/sighting"
)

// idAnswer is a vLLM answer holding ids, count first, with sep between
// ids.
func idAnswer(ids []uint64, sep string) []byte {
	b := []byte(`{"count":` + strconv.Itoa(len(ids)) + `,"max_model_len":131072,"tokens":[`)
	for i, id := range ids {
		if i > 0 {
			b = append(b, sep...)
		}
		b = strconv.AppendUint(b, id, 10)
	}
	return append(b, `],"token_strs":null}`...)
}

// randomIDs are n ids of mixed lengths, as a real vocabulary gives.
func randomIDs(rng *rand.Rand, n int) []uint64 {
	ids := make([]uint64, n)
	for i := range ids {
		ids[i] = rng.Uint64N(152000) >> rng.UintN(12)
	}
	return ids
}

// resumeDecode decodes raw with r and reports how many ids were decoded
// rather than copied.
func resumeDecode(raw []byte, maxTokens int, r *tokenResume) ([]uint64, int, error) {
	d := tokenizeDecoder{b: raw, maxTokens: maxTokens, res: r}
	toks, err := d.answer()
	if err == nil && d.arr != nil {
		r.keep(d.arr, toks, d.offs, d.fresh)
	}
	return toks, d.fresh, err
}

// TestTokenizeResume: an answer sharing its first bytes with a kept one
// decodes to exactly what decoding it afresh gives, copying the shared
// ids; every way a second answer can differ from the kept one, or be
// wrong, is answered as without resuming.
func TestTokenizeResume(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	base := randomIDs(rng, 8192)
	with := func(head []uint64, tail ...uint64) []uint64 { return append(append([]uint64{}, head...), tail...) }
	for _, c := range []struct {
		name      string
		b         []byte
		max       int
		maxFresh  int // the decode must copy all but at most this many ids (-1: no bound)
		wantError bool
	}{
		{"a new last id", idAnswer(with(base[:8191], 7), ","), 0, 256, false},
		{"a longer answer", idAnswer(with(base, 1, 2, 3), ","), 0, 259, false},
		{"a shorter answer", idAnswer(base[:5000], ","), 0, 256, false},
		{"differs at id 1000", idAnswer(with(base[:1000], base[1000]+1), ","), 0, 257, false},
		{"one digit more at id 3000", idAnswer(with(with(base[:3000], base[3000]*10+1), base[3001:]...), ","), 0, 5192 + 256, false},
		{"spaces after commas", idAnswer(base, ", "), 0, -1, false},
		{"the kept answer again", idAnswer(base, ","), 0, 256, false},
		{"count off by one", bytes.Replace(idAnswer(base, ","), []byte(`"count":8192`), []byte(`"count":8193`), 1), 0, -1, true},
		{"a bad id after the shared part", idAnswer(with(base[:4000], 1), ",")[:len(idAnswer(with(base[:4000], 1), ","))-22], 0, -1, true},
		{"leading zero after the shared part", bytes.Replace(idAnswer(with(base[:6000], 5, 6), ","), []byte(",5,6]"), []byte(",05,6]"), 1), 0, -1, true},
		{"empty tokens after the shared part", bytes.Replace(idAnswer(with(base[:6000], 5), ","), []byte(",5]"), []byte(",]"), 1), 0, -1, true},
		{"more ids than the bound", idAnswer(base, ","), 4000, -1, true},
		{"the bound exactly", idAnswer(base[:6000], ","), 6000, 256, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			max := DefaultMaxTokenizeTokens
			if c.max > 0 {
				max = c.max
			}
			r := newTokenResume()
			for range 2 { // kept from its second sighting
				if _, _, err := resumeDecode(idAnswer(base, ","), DefaultMaxTokenizeTokens, r); err != nil {
					t.Fatal(err)
				}
			}
			want, wantErr := decodeTokenizeResponse(c.b, max)
			got, fresh, err := resumeDecode(c.b, max, r)
			if (err != nil) != c.wantError || (wantErr != nil) != c.wantError {
				t.Fatalf("error %v, afresh %v; want an error: %v", err, wantErr, c.wantError)
			}
			if err != nil {
				if err.Error() != wantErr.Error() {
					t.Fatalf("error %q, afresh %q", err, wantErr)
				}
				return
			}
			if !equalTokens(got, want) {
				t.Fatalf("resumed ids differ from the ids decoded afresh (%d vs %d)", len(got), len(want))
			}
			if c.maxFresh >= 0 && fresh > c.maxFresh {
				t.Fatalf("%d of %d ids decoded afresh, want at most %d", fresh, len(got), c.maxFresh)
			}
		})
	}
}

// TestTokenizeResumeKeepsOnlyWholeArrays: an answer whose last tokens
// value is empty or not an array keeps nothing of an earlier tokens
// value, and nothing is kept of an answer that fails.
func TestTokenizeResumeKeepsOnlyWholeArrays(t *testing.T) {
	ids := randomIDs(rand.New(rand.NewPCG(3, 4)), 2000)
	arr := idAnswer(ids, ",")
	arr = arr[bytes.IndexByte(arr, '[') : bytes.LastIndexByte(arr, ']')+1]
	for _, raw := range []string{
		`{"tokens":` + string(arr) + `,"tokens":[]}`,
		`{"tokens":` + string(arr) + `,"tokens":null}`,
		`{"tokens":` + string(arr) + `,"tokens":"x"}`,
		`{"tokens":` + string(arr) + `,"count":1}`,
		`{"tokens":` + string(arr) + `} x`,
	} {
		r := newTokenResume()
		_, _, _ = resumeDecode([]byte(raw), DefaultMaxTokenizeTokens, r)
		_, _, _ = resumeDecode([]byte(raw), DefaultMaxTokenizeTokens, r)
		if r.kept.Len() != 0 {
			t.Errorf("%.40q…: kept an array", raw)
		}
		// Whatever was kept, a lookup of the array is safe and exact.
		got, _, err := resumeDecode([]byte(`{"tokens":`+string(arr)+`}`), DefaultMaxTokenizeTokens, r)
		if err != nil || !equalTokens(got, ids) {
			t.Errorf("%.40q…: then %d ids, %v", raw, len(got), err)
		}
	}
}

// TestTokenizeResumeSecondSighting: an array is kept only once its key
// was offered before, so that answers sharing no prefix copy nothing.
func TestTokenizeResumeSecondSighting(t *testing.T) {
	rng := rand.New(rand.NewPCG(13, 14))
	r := newTokenResume()
	a := idAnswer(randomIDs(rng, 3000), ",")
	if _, _, err := resumeDecode(a, DefaultMaxTokenizeTokens, r); err != nil || r.kept.Len() != 0 {
		t.Fatalf("after one sighting: %d kept, %v", r.kept.Len(), err)
	}
	if _, _, err := resumeDecode(a, DefaultMaxTokenizeTokens, r); err != nil || r.kept.Len() != 1 {
		t.Fatalf("after two sightings: %d kept, %v", r.kept.Len(), err)
	}
}

// TestTokenizeResumeBudget: the kept arrays stay within the budget, and
// an answer too large for a quarter of it is not kept.
func TestTokenizeResumeBudget(t *testing.T) {
	const budget = 1 << 20
	r := newTokenResume()
	r.kept = sighting.NewKeep[*resumeEntry](budget, maxSeenArrays)
	rng := rand.New(rand.NewPCG(5, 6))
	for i := range 40 {
		ids := append([]uint64{uint64(i)}, randomIDs(rng, 3000)...) // a key of its own
		for range 2 {
			if _, _, err := resumeDecode(idAnswer(ids, ","), DefaultMaxTokenizeTokens, r); err != nil {
				t.Fatal(err)
			}
		}
		if r.kept.Bytes() > budget {
			t.Fatalf("after %d answers %d bytes kept, budget %d", i+1, r.kept.Bytes(), budget)
		}
	}
	r = newTokenResume()
	r.kept = sighting.NewKeep[*resumeEntry](budget, maxSeenArrays)
	big := idAnswer(randomIDs(rng, 40000), ",")
	for range 2 {
		if _, _, err := resumeDecode(big, DefaultMaxTokenizeTokens, r); err != nil {
			t.Fatal(err)
		}
	}
	if r.kept.Len() != 0 {
		t.Fatalf("an answer over a quarter of the budget was kept (%d bytes)", r.kept.Bytes())
	}
}

// FuzzTokenizeResume: decoding b after a was kept gives what decoding b
// afresh gives, ids and errors alike, with settings small enough for the
// fuzzer's inputs to resume.
func FuzzTokenizeResume(f *testing.F) {
	long := string(idAnswer(randomIDs(rand.New(rand.NewPCG(7, 8)), 60), ","))
	f.Add([]byte(long), []byte(strings.Replace(long, "]", ",1]", 1)))
	f.Add([]byte(`{"tokens":[1,2,3,4,5,6,7,8,9,10]}`), []byte(`{"tokens":[1,2,3,4,5,6,7,8,90]}`))
	f.Add([]byte(`{"tokens":[1, 2, 3, 4, 5, 6]}`), []byte(`{"tokens":[1, 2, 3, 4, 50, 6],"count":6}`))
	f.Add([]byte(`{"tokens":[11,22,33,44,55,66]}`), []byte(`{"tokens":[11,22,33,44,55,66],"tokens":[]}`))
	f.Add([]byte(`{"tokens":[11,22,33,44,55,66]}`), []byte(`{"tokens":[11,22,33,44,0x]}`))
	for _, s := range tokenizeSeeds {
		f.Add([]byte(s), []byte(s))
	}
	f.Fuzz(func(t *testing.T, a, b []byte) {
		r := newTokenResume()
		r.minBytes, r.keyBytes, r.stride = 8, 4, 2
		r.kept = sighting.NewKeep[*resumeEntry](1<<16, maxSeenArrays)
		for _, max := range []int{DefaultMaxTokenizeTokens, 3} {
			_, _, _ = resumeDecode(a, max, r)
			_, _, _ = resumeDecode(a, max, r) // kept from its second sighting
			want, wantErr := decodeTokenizeResponse(b, max)
			for round := range 2 { // then again, from b's own kept array
				got, _, err := resumeDecode(b, max, r)
				if (err == nil) != (wantErr == nil) || (err != nil && err.Error() != wantErr.Error()) {
					t.Fatalf("round %d, max %d: %q after %q: error %v, afresh %v", round, max, b, a, err, wantErr)
				}
				if err == nil && !equalTokens(got, want) {
					t.Fatalf("round %d, max %d: %q after %q: %v, afresh %v", round, max, b, a, got, want)
				}
			}
		}
	})
}

// BenchmarkTokenizeResume8k decodes 8k-id answers that share all but
// their last id, with and without the kept arrays, and answers whose first
// id no answer had before (fresh), which the kept arrays cannot shorten
// but still record: the path of a prompt never seen.
func BenchmarkTokenizeResume8k(b *testing.B) {
	ids := randomIDs(rand.New(rand.NewPCG(9, 10)), 8192)
	shared := make([][]byte, 64)
	for i := range shared {
		ids[len(ids)-1] = uint64(i)
		shared[i] = idAnswer(ids, ",")
	}
	ids[0] = 100000
	fresh := idAnswer(ids, ",")
	first := bytes.IndexByte(fresh, '[') + 1 // its 6 digits are rewritten
	for _, c := range []struct {
		name   string
		resume bool
		answer func(i int) []byte
	}{
		{"resume=false", false, func(i int) []byte { return shared[i%len(shared)] }},
		{"resume=true", true, func(i int) []byte { return shared[i%len(shared)] }},
		{"fresh", true, func(i int) []byte {
			strconv.AppendUint(fresh[:first], uint64(100000+i%900000), 10)
			return fresh
		}},
	} {
		b.Run(c.name, func(b *testing.B) {
			var r *tokenResume
			if c.resume {
				r = newTokenResume()
			}
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				i++
				if _, err := decodeTokenizeResume(c.answer(i), DefaultMaxTokenizeTokens, r); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

package remotetok

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"runtime"
	"strconv"
	"strings"
	"testing"
)

// jsonTokenizeResponse is the /tokenize answer decoded by encoding/json,
// as the gateway did before decodeTokenizeResponse: the reference the
// decoder must agree with.
func jsonTokenizeResponse(raw []byte) ([]uint64, error) {
	var r struct {
		Count       *int            `json:"count"`
		MaxModelLen int             `json:"max_model_len"`
		Tokens      json.RawMessage `json:"tokens"`
	}
	if err := json.Unmarshal(raw, &r); err != nil {
		return nil, fmt.Errorf("tokenize: decode response: %w", err)
	}
	if r.Tokens == nil || string(r.Tokens) == "null" {
		return nil, errors.New("tokenize: response has no tokens")
	}
	toks, err := jsonTokenIDs(r.Tokens)
	if err != nil {
		return nil, err
	}
	if r.Count != nil && *r.Count != len(toks) {
		return nil, fmt.Errorf("tokenize: response count %d != %d tokens", *r.Count, len(toks))
	}
	return toks, nil
}

// jsonTokenIDs is the old parser of the tokens array that encoding/json
// had validated.
func jsonTokenIDs(b []byte) ([]uint64, error) {
	i := skipJSONSpace(b, 0)
	if i >= len(b) || b[i] != '[' {
		return nil, errors.New("tokens is not an array")
	}
	out := make([]uint64, 0, bytes.Count(b, []byte{','})+1)
	if i = skipJSONSpace(b, i+1); i < len(b) && b[i] == ']' {
		return out, nil
	}
	for {
		start := i
		var v uint64
		for ; i < len(b) && '0' <= b[i] && b[i] <= '9'; i++ {
			d := uint64(b[i] - '0')
			if v > (math.MaxUint64-d)/10 {
				return nil, errors.New("token overflows uint64")
			}
			v = v*10 + d
		}
		if i = skipJSONSpace(b, i); i == start || i >= len(b) || (b[i] != ',' && b[i] != ']') {
			return nil, errors.New("token is not a non-negative integer")
		}
		out = append(out, v)
		if b[i] == ']' {
			return out, nil
		}
		i = skipJSONSpace(b, i+1)
	}
}

// tokenizeSeeds are answers shaped like vLLM's and the edge cases of the
// grammar and of encoding/json's struct decoding.
var tokenizeSeeds = []string{
	`{"count":4,"max_model_len":131072,"tokens":[128000,9906,1917,0],"token_strs":null}`,
	"{\n  \"count\": 2,\n  \"max_model_len\": 4096,\n  \"tokens\": [\n    1,\n    2\n  ],\n  \"token_strs\": [\"a\", \"b\"]\n}\n",
	`{"tokens":[1,2],"count":2}`,
	`{"count":3,"tokens":[1,2]}`,
	`{"count":null,"tokens":[5]}`,
	`{"count":-0,"tokens":[]}`,
	`{"count":1.0,"tokens":[1]}`,
	`{"max_model_len":"x","tokens":[1]}`,
	`{"max_model_len":null,"tokens":[1]}`,
	`{"max_model_len":9223372036854775808,"tokens":[1]}`,
	`{"count":-9223372036854775808,"tokens":[1]}`,
	`{"tokens":[01]}`,
	`{"tokens":[-1]}`,
	`{"tokens":[1,]}`,
	`{"tokens":[1 2]}`,
	`{"tokens":[1],"tokens":null}`,
	`{"tokens":[null],"tokens":[7]}`,
	`{"tokens":"x","tokens":[7]}`,
	`{"to\u006bens":[3]}`,
	"{\"to\u212aen\u017f\":[3]}",
	`{"COUNT":1,"Max_Model_Len":2,"Tokens":[9]}`,
	`{"x":{"y":[true,false,null,"\"\\\/\b\f\n\r\t\u00e9"]},"tokens":[1]}`,
	`{"x":"\x","tokens":[1]}`,
	"{\"x\":\"a\x01\",\"tokens\":[1]}",
	"{\"x\":\"\xff\xfe\",\"tokens\":[1]}",
	`{"x":1e5,"y":-0.5E-3,"z":0,"tokens":[1]}`,
	`{"x":1.,"tokens":[1]}`,
	`{"x":.5,"tokens":[1]}`,
	`{"x":tru,"tokens":[1]}`,
	`{}`,
	``,
	` null `,
	`"tokens"`,
	`{"tokens":[1]`,
	`{"tokens":[1]}}`,
	`{"tokens" [1]}`,
	`{"tokens":[1] "count":1}`,
	`{"a":[],"b":{},"tokens":[ ]}`,
	`{"tokens":[18446744073709551615]}`,
	`{"tokens":[18446744073709551616]}`,
	`{"tokens":[1e400]}`,
}

// FuzzTokenizeResponseDecoder checks decodeTokenizeResponse against the
// encoding/json decoding it replaced: the same inputs accepted, the same
// token ids returned.
func FuzzTokenizeResponseDecoder(f *testing.F) {
	for _, s := range tokenizeSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		got, err := decodeTokenizeResponse(b, DefaultMaxTokenizeTokens)
		want, wantErr := jsonTokenizeResponse(b)
		if (err == nil) != (wantErr == nil) {
			t.Fatalf("%q: decoder error %v, encoding/json error %v", b, err, wantErr)
		}
		if err == nil && (got == nil || !equalTokens(got, want)) {
			t.Fatalf("%q: decoder %v, encoding/json %v", b, got, want)
		}
	})
}

// TestTokenizeDecoderSeeds runs the fuzz seeds and a few inputs too large
// for the fuzzer to find: deep nesting at encoding/json's limit and past
// it, and a realistic 8k answer.
func TestTokenizeDecoderSeeds(t *testing.T) {
	inputs := append([]string{}, tokenizeSeeds...)
	for _, depth := range []int{9999, 10000} {
		inputs = append(inputs, `{"x":`+strings.Repeat("[", depth)+strings.Repeat("]", depth)+`,"tokens":[1]}`,
			`{"x":`+strings.Repeat(`{"a":`, depth)+"1"+strings.Repeat("}", depth)+`,"tokens":[1]}`)
	}
	inputs = append(inputs, string(realAnswer(8192, true)), string(realAnswer(8192, false)))
	for _, in := range inputs {
		got, err := decodeTokenizeResponse([]byte(in), DefaultMaxTokenizeTokens)
		want, wantErr := jsonTokenizeResponse([]byte(in))
		if (err == nil) != (wantErr == nil) || (err == nil && !equalTokens(got, want)) {
			t.Errorf("%.80q: decoder %v %v, encoding/json %v %v", in, len(got), err, len(want), wantErr)
		}
	}
}

// realAnswer is a vLLM answer of n ids, count first or last.
func realAnswer(n int, countFirst bool) []byte {
	var b []byte
	if countFirst {
		b = append(b, `{"count":`+strconv.Itoa(n)+`,"max_model_len":131072,"tokens":[`...)
	} else {
		b = append(b, `{"max_model_len":131072,"tokens":[`...)
	}
	for i := range n {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendInt(b, int64(1000+i*7919%150000), 10)
	}
	b = append(b, `],"token_strs":null`...)
	if !countFirst {
		b = append(b, `,"count":`+strconv.Itoa(n)...)
	}
	return append(b, '}')
}

// TestTokenizeDecoderBounds: an answer of more ids than MaxTokens is
// refused, whether or not its count said so first; at the bound it is
// accepted. The result has exactly its length as capacity either way (it
// is cached whole).
func TestTokenizeDecoderBounds(t *testing.T) {
	for _, first := range []bool{true, false} {
		raw := realAnswer(100, first)
		if toks, err := decodeTokenizeResponse(raw, 100); err != nil || len(toks) != 100 || cap(toks) != 100 {
			t.Errorf("count first %v: at the bound: %d ids (cap %d), %v", first, len(toks), cap(toks), err)
		}
		if _, err := decodeTokenizeResponse(raw, 99); err == nil || !strings.Contains(err.Error(), "more than 99 tokens") {
			t.Errorf("count first %v: past the bound: %v", first, err)
		}
	}
	// A count larger than the ids' array could hold is no reason to
	// allocate it, even when the input as a whole could (padding after
	// the array): the count is within MaxTokens, so only the array's
	// bytes bound it; believed, it would cost 16 MiB.
	pad := strings.Repeat("x", 8<<20)
	for _, in := range []string{
		`{"count":1000000000,"tokens":[1]}`,
		`{"count":` + strconv.Itoa(DefaultMaxTokenizeTokens) + `,"tokens":[1]}`,
		`{"count":` + strconv.Itoa(DefaultMaxTokenizeTokens) + `,"tokens":[1],"pad":"` + pad + `"}`,
	} {
		raw := []byte(in)
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		before := ms.TotalAlloc
		_, err := decodeTokenizeResponse(raw, DefaultMaxTokenizeTokens)
		runtime.ReadMemStats(&ms)
		if err == nil {
			t.Errorf("%.60q: a lying count was accepted", in)
		}
		if got := ms.TotalAlloc - before; got > 1<<20 {
			t.Errorf("%.60q: allocated %d bytes", in, got)
		}
	}
}

// BenchmarkTokenizeDecode8k compares the decoder with the encoding/json
// decoding it replaced on a realistic 8192-id answer.
func BenchmarkTokenizeDecode8k(b *testing.B) {
	raw := realAnswer(8192, true)
	for _, c := range []struct {
		name string
		fn   func([]byte) ([]uint64, error)
	}{
		{"decoder", func(r []byte) ([]uint64, error) { return decodeTokenizeResponse(r, DefaultMaxTokenizeTokens) }},
		{"encoding-json", jsonTokenizeResponse},
	} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(raw)))
			for b.Loop() {
				if _, err := c.fn(raw); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

package remotetok

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"strconv"
	"strings"
	"testing"
)

// parseTokenizeResponse decodes {count, max_model_len, tokens} with the
// default bound on the number of ids (see decodeTokenizeResponse).
func parseTokenizeResponse(raw []byte) ([]uint64, error) {
	return decodeTokenizeResponse(raw, DefaultMaxTokenizeTokens)
}

// FuzzParseTokenizeResponse checks parseTokenizeResponse against
// tokenizeOracle, an independent reading of the same bytes with
// encoding/json's generic decoder: both must accept the same inputs and
// return the same token ids.
func FuzzParseTokenizeResponse(f *testing.F) {
	for _, s := range []string{
		`{"count":2,"max_model_len":8192,"tokens":[1,2],"token_strs":null}`,
		`{"tokens":[]}`,
		`{"count":1,"tokens":[-5]}`,
		`null`,
		`{"tokens":[1e400]}`,
		`{"tokens":[null]}`,
		`{"tokens":[18446744073709551615, 0 ,7]}`,
		`{"tokens":[18446744073709551616]}`,
		`{"tokens":[1.0]}`,
		`{"TOKENS":[3],"Count":1}`,
		`{"tokens":[1],"tokens":[2,3],"count":2}`,
		`{"count":"x","count":1,"tokens":[1]}`,
		`{"tokens":["1"]}`,
		`[1]`,
		`{"tokens":[1]} x`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		toks, err := parseTokenizeResponse(b)
		want, wantErr := tokenizeOracle(b)
		if (err == nil) != (wantErr == nil) {
			t.Fatalf("%q: parser error %v, oracle error %v", b, err, wantErr)
		}
		if err == nil && (toks == nil || !equalTokens(toks, want)) {
			t.Fatalf("%q: parser %v, oracle %v", b, toks, want)
		}
		// Decoded into a caller's buffer that holds earlier ids (as
		// TokenizeDerived reuses one): the same answer.
		buf := []uint64{9, 9, 9}
		into, intoErr := decodeTokenizeInto(b, DefaultMaxTokenizeTokens, nil, &buf)
		if (intoErr == nil) != (err == nil) || (err == nil && !equalTokens(into, toks)) {
			t.Fatalf("%q: into a buffer %v (%v), alone %v (%v)", b, into, intoErr, toks, err)
		}
	})
}

// tokenizeOracle is what parseTokenizeResponse must make of b: vLLM's
// {"count": int, "max_model_len": int, "tokens": [int, ...]} read from
// encoding/json's generic decoding with UseNumber, so that no number goes
// through float64:
//   - b is a JSON object (not null);
//   - tokens is required and an array of integers in [0, 2^64), without
//     fraction or exponent;
//   - count, if not null, is an int64 equal to the number of tokens;
//   - max_model_len, if not null, is an int64 (unused, but validated);
//   - other keys may hold anything.
//
// Two rules follow encoding/json's decoding into a struct, which the
// parser relies on, rather than the schema: keys match case-insensitively
// ("Tokens" is tokens), and of duplicate keys the last wins, except that
// any count or max_model_len of the wrong type rejects (encoding/json
// reports the first type error it meets). vLLM sends neither.
func tokenizeOracle(b []byte) ([]uint64, error) {
	if !json.Valid(b) {
		return nil, errors.New("invalid JSON")
	}
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	if tok, err := d.Token(); err != nil || tok != json.Delim('{') {
		return nil, errors.New("not an object")
	}
	var tokens, count any
	var haveTokens bool
	for d.More() {
		k, err := d.Token()
		if err != nil {
			return nil, err
		}
		var v any
		if err := d.Decode(&v); err != nil {
			return nil, err
		}
		switch key := k.(string); {
		case strings.EqualFold(key, "tokens"):
			tokens, haveTokens = v, true
		case strings.EqualFold(key, "count"):
			if _, ok := oracleInt(v); !ok {
				return nil, errors.New("count is not an integer")
			}
			count = v
		case strings.EqualFold(key, "max_model_len"):
			if _, ok := oracleInt(v); !ok {
				return nil, errors.New("max_model_len is not an integer")
			}
		}
	}
	if _, err := d.Token(); err != nil { // the closing '}'
		return nil, err
	}
	if _, err := d.Token(); err != io.EOF {
		return nil, errors.New("data after the object")
	}
	return oracleTokens(tokens, haveTokens, count)
}

// oracleTokens applies the tokens and count rules to the decoded values.
func oracleTokens(tokens any, present bool, count any) ([]uint64, error) {
	arr, ok := tokens.([]any)
	if !present || !ok {
		return nil, errors.New("tokens is not an array")
	}
	out := make([]uint64, 0, len(arr))
	for _, x := range arr {
		n, ok := x.(json.Number)
		if !ok {
			return nil, errors.New("token id is not a number")
		}
		u, err := strconv.ParseUint(n.String(), 10, 64)
		if err != nil {
			return nil, err
		}
		out = append(out, u)
	}
	if c, _ := oracleInt(count); count != nil && c != int64(len(out)) {
		return nil, errors.New("count differs")
	}
	return out, nil
}

// oracleInt reports whether v is null or an integer that fits an int64.
func oracleInt(v any) (int64, bool) {
	if v == nil {
		return 0, true
	}
	n, ok := v.(json.Number)
	if !ok {
		return 0, false
	}
	i, err := strconv.ParseInt(n.String(), 10, 64)
	return i, err == nil
}

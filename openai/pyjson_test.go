package openai

import "testing"

// The expected strings were printed by CPython 3 (json.dumps and str of
// json.loads of the input), which is what vLLM runs on the parsed request.
func TestPyDumpsAndStr(t *testing.T) {
	tests := []struct{ in, dumps, str string }{
		{
			`{"b": 1, "a": [1.0, 2.5e-7, 1e16, 1e15, -0.0, 0.0001, 1e400, 10, -0, 123456789012345678901234567890]}`,
			`{"b": 1, "a": [1.0, 2.5e-07, 1e+16, 1000000000000000.0, -0.0, 0.0001, Infinity, 10, 0, 123456789012345678901234567890]}`,
			`{'b': 1, 'a': [1.0, 2.5e-07, 1e+16, 1000000000000000.0, -0.0, 0.0001, inf, 10, 0, 123456789012345678901234567890]}`,
		},
		{
			`{"s": "h\u00e9llo \ud83d\ude00 \"q\" \\ \n\t\u0001\u007f", "t": true, "f": false, "n": null, "o": {}, "l": []}`,
			`{"s": "h\u00e9llo \ud83d\ude00 \"q\" \\ \n\t\u0001\u007f", "t": true, "f": false, "n": null, "o": {}, "l": []}`,
			`{'s': 'héllo 😀 "q" \\ \n\t\x01\x7f', 't': True, 'f': False, 'n': None, 'o': {}, 'l': []}`,
		},
		{`{"k": 1, "k": 2, "j": 3}`, `{"k": 2, "j": 3}`, `{'k': 2, 'j': 3}`},
		{
			`{"x": 1.5, "y": 3.14159, "z": 2E3, "w": 1.0e-5}`,
			`{"x": 1.5, "y": 3.14159, "z": 2000.0, "w": 1e-05}`,
			`{'x': 1.5, 'y': 3.14159, 'z': 2000.0, 'w': 1e-05}`,
		},
		{`"it's"`, `"it's"`, `it's`}, // str of a str is itself
		{`["it's", "a\"b", "it's \"x\"", "\u0085\u200b\u00a0é😀\udb40\udc01"]`,
			`["it's", "a\"b", "it's \"x\"", "\u0085\u200b\u00a0\u00e9\ud83d\ude00\udb40\udc01"]`,
			`["it's", 'a"b', 'it\'s "x"', '\x85\u200b\xa0é😀\U000e0001']`},
	}
	for _, tc := range tests {
		if got := pyDumps([]byte(tc.in)); got != tc.dumps {
			t.Errorf("pyDumps(%s)\n got %s\nwant %s", tc.in, got, tc.dumps)
		}
		if got := pyStr([]byte(tc.in)); got != tc.str {
			t.Errorf("pyStr(%s)\n got %s\nwant %s", tc.in, got, tc.str)
		}
	}
}

package openai

import (
	"mime"
	"net/http"
	"strings"
)

// IsInference reports whether the request is an OpenAI-style inference call
// that carries a JSON body worth reading.
func IsInference(r *http.Request) bool {
	if r.Method != http.MethodPost {
		return false
	}
	p := r.URL.Path
	if !strings.HasSuffix(p, "/chat/completions") && !strings.HasSuffix(p, "/completions") {
		return false
	}
	if ct := r.Header.Get("Content-Type"); ct != "" {
		mt, ok := MediaType(ct)
		if !ok || (mt != "application/json" && !strings.HasSuffix(mt, "+json")) {
			return false
		}
	}
	return true
}

// MediaType is mime.ParseMediaType's media type, lower-cased, without its
// allocations for the common exact forms.
func MediaType(ct string) (string, bool) {
	switch ct {
	case "application/json", "text/event-stream":
		return ct, true
	case "application/json; charset=utf-8", "text/event-stream; charset=utf-8":
		return ct[:strings.IndexByte(ct, ';')], true
	}
	mt, _, err := mime.ParseMediaType(ct)
	return mt, err == nil
}

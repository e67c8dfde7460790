package openai

import (
	"mime"
	"net/http"
	"strings"
)

// IsInference reports whether the request is a call to one of the APIs a
// vLLM fleet serves (see EndpointOf) that carries a JSON body worth
// reading.
func IsInference(r *http.Request) bool {
	if r.Method != http.MethodPost || EndpointOf(r.URL.Path) == EndpointOther {
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

// Endpoint is the API a request path belongs to, by vLLM's default
// routes; it picks the body parser.
type Endpoint int

// The endpoints the gateway parses bodies of.
const (
	EndpointOther       Endpoint = iota // anything else: not parsed
	EndpointChat                        // /v1/chat/completions
	EndpointCompletions                 // /v1/completions
	EndpointResponses                   // /v1/responses
	EndpointMessages                    // /v1/messages (Anthropic)
	EndpointPooling                     // /v1/embeddings, /pooling, /classify, /score, /rerank
)

// endpointSuffixes maps path suffixes to endpoints, longest first where
// one suffix ends another ("/chat/completions" before "/completions").
// Suffixes, as in IsInference, so a gateway mounted under a prefix works;
// vLLM serves /score and /rerank also under /v1 and /rerank under /v2.
var endpointSuffixes = []struct {
	suffix string
	e      Endpoint
}{
	{"/chat/completions", EndpointChat},
	{"/completions", EndpointCompletions},
	{"/v1/responses", EndpointResponses},
	{"/v1/messages", EndpointMessages},
	{"/embeddings", EndpointPooling},
	{"/pooling", EndpointPooling},
	{"/classify", EndpointPooling},
	{"/score", EndpointPooling},
	{"/rerank", EndpointPooling},
}

// EndpointOf returns the endpoint of a URL path. Paths below an endpoint
// (/v1/responses/{id}, /v1/messages/count_tokens) are EndpointOther: they
// generate nothing.
func EndpointOf(path string) Endpoint {
	for _, s := range endpointSuffixes {
		if strings.HasSuffix(path, s.suffix) {
			return s.e
		}
	}
	return EndpointOther
}

// String names the endpoint for logs and metrics labels.
func (e Endpoint) String() string {
	switch e {
	case EndpointChat:
		return "chat"
	case EndpointCompletions:
		return "completions"
	case EndpointResponses:
		return "responses"
	case EndpointMessages:
		return "messages"
	case EndpointPooling:
		return "pooling"
	}
	return "other"
}

// Parse parses a body of the endpoint with its parser: ParseRequest for
// chat and completions, ParseResponses, ParseAnthropic, ParsePooling. For
// EndpointOther it returns nil and no error.
func (e Endpoint) Parse(body []byte) (*Request, error) {
	switch e {
	case EndpointChat, EndpointCompletions:
		return ParseRequest(body)
	case EndpointResponses:
		return ParseResponses(body)
	case EndpointMessages:
		return ParseAnthropic(body)
	case EndpointPooling:
		return ParsePooling(body)
	}
	return nil, nil
}

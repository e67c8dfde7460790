// Package openai is the wire format of the APIs the gateway serves, with
// no other package of the project under it: what the handler and the
// policy read of a request, and what they write to clients.
//
//   - ParseRequest: a single-pass walk over an OpenAI-style request body that
//     extracts the few fields the gateway needs without decoding messages.
//   - IsInference and MediaType: which requests are admitted and routed on
//     their body.
//   - StreamObserver and ParseUsage: TTFT, inter-token gaps, usage and errors
//     from an upstream SSE stream or JSON response, with bounded memory.
//   - KeepAlive, ErrorEvent, ErrorJSON: bytes the handler writes to clients.
package openai

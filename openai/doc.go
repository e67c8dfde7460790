// Package openai is the wire format of the APIs the gateway serves, with
// no other package of the project under it: what the handler and the
// policy read of a request, and what they write to clients.
//
//   - ParseRequest: a single-pass walk over an OpenAI-style request body that
//     extracts the few fields the gateway needs without decoding messages.
//   - ParseResponses, ParseAnthropic, ParsePooling: the other APIs vLLM
//     serves. Responses and Anthropic Messages bodies are converted to the
//     chat messages vLLM builds from them before the chat template, so
//     tokenization and prefix routing see the engine's prompt; pooling
//     requests are prefill only. EndpointOf picks the parser by path.
//   - IsInference and MediaType: which requests are admitted and routed on
//     their body.
//   - StreamObserver and ParseUsage: TTFT, inter-token gaps, usage and errors
//     from an upstream SSE stream or JSON response, with bounded memory.
//   - KeepAlive, ErrorEvent, ErrorJSON: bytes the handler writes to clients.
package openai

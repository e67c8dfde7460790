// Package kvindex knows which vLLM engine holds which prompt prefix in its
// KV cache. It has no sockets: the ZeroMQ subscription lives in
// kvindex/zmqsub and drives a Feed.
//
// The pieces, from the wire inward:
//
//   - Decoder (DecodeBatch) decodes vLLM's KV-event batches in both wire
//     shapes (positional arrays of every version, map events after vLLM
//     #42892), hashes as ints of any width or bytes of any length. It is
//     written against outside input: announced lengths are checked against
//     the bytes left before allocating, nesting is bounded, unknown event
//     tags are counted and skipped.
//   - Feed applies one engine's message stream [topic, seq, payload] to its
//     Mirror, filling sequence gaps through the engine's replay endpoint
//     and otherwise resetting, so the mirror never claims a block the
//     engine dropped for longer than one resync.
//   - Mirror is one engine's GPU prefix cache: the engine's block hashes,
//     reference-counted, mapped to the gateway's own keys, bounded by the
//     engine's capacity (oldest evicted first).
//   - Index answers "how many leading blocks of this prompt does each
//     engine hold" (Match, or Keys + MatchKeys). Its keys are the gateway's
//     chained hash of the block tokens and extra keys (LoRA name, cache
//     salt, multimodal ids), so it works whatever the engine's
//     PYTHONHASHSEED or hash algorithm; VerifyConfig checks the engine's
//     own sha256_cbor hashes (Hasher) on a sample, to surface a wrong seed
//     or block size.
//   - Predict adds speculative entries: blocks an engine was just sent and
//     has not announced yet, which Match counts as held (and reports as
//     EngineMatch.Predicted) until the engine's events confirm or drop
//     them, or their short TTL ends.
//   - ApproxTree is the fallback for engines without events: which engines
//     recently served which text prefixes.
//
// Index, Mirror's exported methods and ApproxTree are safe for concurrent
// use. A Feed is driven by one goroutine; a Decoder and a Hasher are not
// shared.
package kvindex

package fleetsim

// An engine's CPU offload tier (Params.CPUBlocks), as vLLM's
// OffloadingConnector keeps one in pinned host memory: blocks the GPU
// evicts are kept there, least recently used first out, and a request
// whose prefix continues past the GPU's cached blocks into the tier loads
// those blocks back instead of recomputing them.
//
// One simplification: the connector stores a block to the CPU as soon as
// it is computed (write-through, so the CPU tier holds copies of what the
// GPU holds), while the model here offloads a block when the GPU evicts
// it (a victim cache, so a tier half the GPU's size adds half its
// capacity). Either way the tier's BlockStored reaches the gateway before
// the GPU's BlockRemoved of that block, which is what lets a gateway apply
// the connector's token-less events by the engine hash it already knows.

// DefaultCPULoadSpeedup is how many times faster than prefill an engine
// loads blocks back from its CPU tier, when Params.CPULoadTokensPerSec is
// 0. For the 32B cost model of the bench's scenarios (Qwen3-32B: 64
// layers × 8 KV heads × 128 dims × K and V × 2 bytes = 256 KiB of KV per
// token; prefill 7,000 tokens/s at half an H100's 989 TFLOP/s), 12 × is
// 84,000 tokens/s, 22 GB/s of KV over the host link: about a third of
// PCIe Gen5 x16's 64 GB/s, allowing for copies of 64 KiB per layer and
// block rather than one large transfer.
const DefaultCPULoadSpeedup = 12

// offload keeps block h, which the GPU is evicting, in the CPU tier and
// announces it as the connector does: the tier's BlockRemoved for the
// block that made room, then its BlockStored for h, both before the GPU's
// BlockRemoved of h (the caller's). A block the tier holds already (it
// was loaded back from there) is only made the most recently used: the
// connector does not store a block twice.
func (e *desEngine) offload(h uint64) {
	if e.cpu == nil || e.cpu.touch(h) {
		return
	}
	if old, ok := e.cpu.use(h); ok {
		e.events = append(e.events, desEvent{cpu: true, hashes: []uint64{old}})
	}
	e.events = append(e.events, desEvent{cpu: true, stored: true, hashes: []uint64{h}})
	e.offloaded++
}

// cpuHits is how many of r's blocks from block `from` on (below limit) the
// CPU tier holds in a row: they continue the GPU's prefix.
func (e *desEngine) cpuHits(r *desReq, from, limit int) int {
	if e.cpu == nil || from >= limit {
		return 0
	}
	return e.cpu.run(r.hashes[from:min(limit, len(r.hashes))])
}

// cpuLoadRate is the engines' load rate from their CPU tier, tokens per
// second (Params.CPULoadTokensPerSec, else DefaultCPULoadSpeedup × the
// prefill rate).
func (p Params) cpuLoadRate() float64 {
	if p.CPULoadTokensPerSec > 0 {
		return p.CPULoadTokensPerSec
	}
	return DefaultCPULoadSpeedup * p.Model.PrefillTokensPerSec
}

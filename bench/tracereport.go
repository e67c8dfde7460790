package main

import (
	"context"
	"fmt"
	"os/exec"
	"strings"
	"time"

	"github.com/llmgw/caddy-llmgw/internal/sim/fleetsim"
	"github.com/llmgw/caddy-llmgw/routing"
)

// checkoutCommit names the commit the harness measures, with "-dirty"
// when the work tree has changes, for the report ("unknown" outside git).
func checkoutCommit(ctx context.Context, root string) string {
	out, err := exec.CommandContext(ctx, "git", "-C", root, "rev-parse", "--short=12", "HEAD").Output()
	if err != nil {
		return "unknown"
	}
	commit := strings.TrimSpace(string(out))
	if st, err := exec.CommandContext(ctx, "git", "-C", root, "status", "--porcelain", "--untracked-files=no").Output(); err == nil && len(st) > 0 {
		commit += "-dirty"
	}
	return commit
}

// renderTrace is the trace section of the report.
func renderTrace(b *strings.Builder, t *TraceResult, sf SectionFile) {
	w := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	p, c, m := t.Params, t.Ceiling, t.Params.Model
	w("### Production trace: the Mooncake conversation trace\n\n")
	w("Command: `%s -trace %s` (%s of this run, on commit `%s`). Only a `-trace` run writes this result (`trace.json` under the results directory); other runs re-render it from there.\n\n", runCommand, p.File, time.Duration(sf.Seconds*float64(time.Second)).Round(time.Second), t.Commit)
	w("The trace ([`bench/traces/`](bench/traces/README.md)): %d requests over %.0f s, %d distinct 512-token blocks. **Infinite-cache hit ceiling: %.1f%% of prompt blocks** (leading blocks some earlier request had; %.1f%% in tokens, the measure the hit rates below are in). Every hash id becomes 512 tokens drawn from the id alone, so equal ids give equal prompt tokens.\n\n",
		c.Requests, c.Seconds, c.DistinctBlocks, c.BlockRate*100, c.TokenRate*100)
	w("**Fleet simulation** ([`internal/sim/fleetsim`](internal/sim/fleetsim), the gateway's own core, as in section 3) at full token counts on section 2's 32B cost model (prefill %.0f tokens/s, decode step %.0f ms, %d-token steps, max_num_seqs %d, block size %d); KV cache %d blocks (%.0fk tokens) per engine — 1.25 × max_num_seqs requests of the trace's mean size, the working-set rule of section 3 (≈ 65 GB of Qwen3-32B KV at 256 KiB per token: more than one H100 holds beside the weights, as on a tensor-parallel pair). Admission: max_inflight = max_num_seqs, kv_limit %.2f, max_park %.0f s. The speedup divides the trace's timestamps.\n\n",
		m.PrefillTokensPerSec, m.DecodeStepSeconds*1000, m.MaxBatchedTokens, m.MaxNumSeqs, m.BlockSize, t.KVBlocks, float64(t.KVBlocks*m.BlockSize)/1000, p.KVLimit, p.MaxPark)
	for _, pc := range t.Pooled {
		renderPooled(w, pc, c)
	}
	for _, l := range p.Ladders {
		t.renderLadder(b, "fleetsim", l.Engines, c.TokenRate)
	}
	if cp, cc := p.Caddy, t.CaddyCeiling; cp != nil && cc != nil {
		sm := cp.scaledModel(m)
		w("**Real Caddy, scaled** (`tracecaddy.go`): the trace's first %d requests (%.0f s; ceiling %.1f%% of blocks, %.1f%% of tokens) through a Caddy process built from this checkout in front of %d `vllmsim` engines, engine clocks %.0f× wall time. Prompts are scaled down %d×: each 512-token block becomes %d words (one simulator token each), and the engines' prefill rate (%.0f tokens/s), step budget (%d tokens) and KV cache (%d blocks of %d) shrink by the same factor, so a prompt takes as long to prefill as at full size and the cache holds the same share of the trace; so do the gateway's settings counted in tokens (`long_prefill` %d; `lb_policy llm`'s `prefill_rate` %g with its token weights), so that it decides as at full size; outputs keep their length, streamed in chunks of %d tokens as in section 2. Hit rates are the engines' cached ÷ prompt tokens as reported in usage (the chat template adds a few tokens per prompt).\n\n",
			cp.Requests, cc.Seconds, cc.BlockRate*100, cc.TokenRate*100, cp.Engines, cp.TimeScale, cp.Scale, fleetsim.TraceBlockTokens/cp.Scale,
			sm.PrefillTokensPerSec, sm.MaxBatchedTokens, t.CaddyKVBlocks, sm.BlockSize,
			scaledLongPrefill(cp.Scale), routing.DefaultPrefillRate/float64(cp.Scale), sm.tokenScale())
		t.renderLadder(b, "caddy", cp.Engines, cc.TokenRate)
	}
}

// renderLadder is one replay's table on one fleet size, the rung where
// round_robin saturates marked.
func (t *TraceResult) renderLadder(b *strings.Builder, replay string, engines int, ceiling float64) {
	w := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	sat := t.saturation(replay, engines)
	w("%s, %d engines", map[string]string{"fleetsim": "Fleet simulation", "caddy": "Real Caddy (scaled)"}[replay], engines)
	if sat > 0 {
		w(" — `round_robin` saturates at **%.3g×** (its TTFT p90 at least doubles from the lowest rung, or it refuses requests), marked ◀", sat)
	} else {
		w(" — `round_robin` does not saturate on this ladder")
	}
	w(":\n\n| speedup | req/s | policy | hit rate | of ceiling | TTFT p50 | p90 | p99 | completed | 503 | failed |\n|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, r := range t.Runs {
		if r.Replay != replay || r.Engines != engines {
			continue
		}
		mark := ""
		if r.Speedup == sat {
			mark = " ◀"
		}
		of := "–"
		if ceiling > 0 {
			of = fmt.Sprintf("%.0f%%", r.HitRate/ceiling*100)
		}
		w("| %.3g×%s | %.1f | `%s` | %.1f%% | %s | %s | %s | %s | %d | %d | %d |\n", r.Speedup, mark, r.Rate, r.Policy, r.HitRate*100, of,
			secs(r.TTFT.P50), secs(r.TTFT.P90), secs(r.TTFT.P99), r.Completed, r.Rejected, r.Errors)
	}
	w("\n")
	if sat > 0 {
		t.renderAtSaturation(b, traceLadder{replay, engines}, sat, ceiling)
	}
}

// traceLadder names one ladder of a trace result: the replay ("fleetsim",
// "caddy") and the fleet size.
type traceLadder struct {
	replay  string
	engines int
}

// renderAtSaturation states llm's figures against the others' at
// round_robin's saturation: the acceptance figures.
func (t *TraceResult) renderAtSaturation(b *strings.Builder, l traceLadder, sat, ceiling float64) {
	replay, engines := l.replay, l.engines
	at := map[string]TraceRun{}
	for _, r := range t.Runs {
		if r.Replay == replay && r.Engines == engines && r.Speedup == sat {
			at[r.Policy] = r
		}
	}
	llm, rr, lc := at[fleetsim.PolicyLLM], at[fleetsim.PolicyRoundRobin], at[fleetsim.PolicyLeastConn]
	if llm.TTFT.P90 <= 0 || rr.TTFT.P90 <= 0 || ceiling <= 0 {
		return
	}
	fmt.Fprintf(b, "At %.3g×: `llm` hits %.1f%%, %.0f%% of the infinite-cache ceiling", sat, llm.HitRate*100, llm.HitRate/ceiling*100)
	for _, pc := range t.Pooled {
		if replay == "fleetsim" && pc.Engines == engines && pc.TokenRate > 0 {
			fmt.Fprintf(b, " and %.0f%% of the pooled-cache one", llm.HitRate/pc.TokenRate*100)
		}
	}
	fmt.Fprintf(b, " (`round_robin` %.1f%%); its TTFT p90 is %.2f× `round_robin`'s", rr.HitRate*100, llm.TTFT.P90/rr.TTFT.P90)
	if lc.TTFT.P90 > 0 {
		fmt.Fprintf(b, " and %.2f× `least_conn`'s", llm.TTFT.P90/lc.TTFT.P90)
	}
	b.WriteString(".\n\n")
}

// renderPooled says what one fleet size's KV cache would hit pooled into
// one cache: evicting by LRU, as each vLLM engine does, and (when the
// result has it) by Belady's MIN, which no eviction order beats.
func renderPooled(w func(string, ...any), pc TracePooled, c fleetsim.TraceCeiling) {
	w("The %d engines' KV cache pooled into one LRU cache (%d blocks of 512 tokens, every engine holding every prefix any engine holds, the running requests' own blocks left out) would hit **%.1f%% of tokens** on this trace. "+
		"LRU is the order vLLM evicts in, and a router only chooses which engine's LRU a prompt goes through, so this is about what routing can approach at this cache size, not a strict bound",
		pc.Engines, pc.Blocks, pc.TokenRate*100)
	if pc.OptimalBlockRate > 0 {
		w(". An eviction order that knew the future (Belady's MIN: a block stays only while its next use comes sooner than another's) would find %.1f%% of the prompt blocks in the same room, where an infinite cache finds %.1f%%: "+
			"at this size the eviction order limits the hit rate, not the room", pc.OptimalBlockRate*100, c.BlockRate*100)
	}
	w(".\n\n")
}

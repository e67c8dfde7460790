// Package routing is the decision logic behind the `lb_policy llm`
// selection policy: given the prompt's size and, per upstream, how much of
// the prompt it holds in its KV cache and how loaded it is, pick the
// upstream where the request will wait least. It has no Caddy types and no
// I/O; the Caddy adapter fills the candidates from the upstream pool, the KV
// index, the approximate prefix tree and the engine registry.
//
// # Cost model
//
// Following NVIDIA Dynamo's KV router (cost = overlap weight × prefill
// blocks to compute + active blocks, argmin) and llm-d's endpoint-picker
// scorers (prefix, queue and KV-utilisation scorers), Pick estimates for
// every candidate the work the request would wait for, in token-equivalents
// (one unit = prefilling one prompt token), and takes the argmin:
//
//	cached  = MatchedBlocks × BlockSize × trust   (trust 1 for Precise, ApproximateWeight for Approximate)
//	prefill = PromptTokens − cached               (the uncached blocks plus the partial tail)
//	cost    = PrefixWeight  × prefill
//	        + QueueWeight   × queued     (Waiting, + Dispatched if Waiting > 0)
//	        + RunningWeight × running    (Running, + Dispatched if Waiting = 0)
//	        + KVWeight      × KVUsage²
//	        + AdapterWeight × share(Adapter)   (LoRA requests: 0 running, 0.2 waiting, 0.4 free slot, 1 no slot)
//
// Waiting is the queue ahead; QueueWeight is the average uncached prefill
// one queued request brings. Dispatched (what this gateway sent since the
// engine's gauges were last scraped) joins the queue when the engine was
// queueing at the scrape (Waiting > 0) and counts as running otherwise. Running sequences
// cost less each: they only share the batch with our prefill. The KV term
// is quadratic so it matters only near the preemption point. When the
// engine's gauges are unknown (LoadKnown false) the gateway's own Inflight
// count stands in as Running and the KV term is 0.
//
// The adapter term is for a request naming a LoRA adapter: vLLM batches
// at most --max-loras adapters, so a request whose adapter is not in
// flight on an engine whose slots are all taken waits for one and then for
// the adapter to load, while one joining its adapter's running requests
// waits for neither. It is a cost, not a filter, so a long prefix cached
// on an engine without the adapter can still win.
//
// Defaults (Config): PrefixWeight 1, ApproximateWeight 0.7, QueueWeight 512,
// RunningWeight 32, KVWeight 1024, KVLimit 0.95, Epsilon 1.5, BoundedLoadMin 8,
// ImbalanceThreshold 32, TieTokens 8, AdapterWeight 8192.
//
// # Worked example
//
// A 1,000-token prompt, block size 16 (62 full blocks). Replica A holds 50
// blocks (800 tokens, precise) and has 2 running, 1 waiting, KV usage 0.3;
// replica B holds nothing and is idle:
//
//	A: 1×(1000−800) + 512×1 + 32×2 + 1024×0.3² = 200 + 512 + 64 + 92.16 = 868.16
//	B: 1×1000                                                         = 1000
//
// A wins (Outcome Hit, Share 50/62 ≈ 0.81). With a second waiting request A
// costs 1380.16 and B wins: the request is OverriddenByLoad. In general a
// holder keeps the request while the tokens it saves exceed QueueWeight per
// extra queued request — here 800 saved tokens buy 1.56 queued requests.
// Had B held the same 50 blocks only approximately, it would be credited
// 560 tokens and cost 440, beating the busier precise holder.
//
// # Exclusions and hot-spot protection
//
// A candidate is excluded (never picked) when the caller marks it
// Unavailable, when it is saturated (load >= MaxInflight) or when its KV
// usage is at or above KVLimit. Load is Running + Waiting + Dispatched
// (never below Inflight), or Inflight alone when gauges are unknown.
//
// Over the remaining candidates two rules stop a replica that holds a
// popular prefix from taking all traffic while others idle:
//
//   - Bounded load (consistent hashing with bounded loads, Mirrokni et al.):
//     with mean = (Σ load + 1) / n, a candidate whose load + 1 would exceed
//     max((1+Epsilon) × mean, BoundedLoadMin) is excluded, unless it is the
//     least loaded. With the defaults, a holder keeps its traffic until it
//     runs 8 requests, then until it has 2.5 times the mean: four replicas
//     with loads 50, 10, 10, 10 give mean 20.25 and a cap of 50.6, so the
//     holder at 50 is excluded (51 > 50.6) and the request spills.
//   - Imbalance: when the most and least loaded candidates differ by more
//     than ImbalanceThreshold requests, the prefix term is dropped and the
//     request goes by load alone (as in SGLang's cache-aware router).
//
// # Ties and outcomes
//
// Costs within TieTokens of the cheapest are ties, broken by rendezvous
// hashing of Request.Key over the candidates' dials: a cold prefix spreads
// evenly over the fleet, and requests with one key agree on a replica —
// never "always the first one". The decision's Outcome is Hit when the
// picked candidate holds the best (tier-weighted) prefix on offer and it is
// non-empty, OverriddenByLoad when another usable-but-loaded (or excluded
// for load) candidate held more, Miss when nobody held any. Index -1 means
// every candidate was excluded; the caller falls back to LeastLoaded or
// Caddy's least_conn.
//
// Breaker is a per-replica circuit breaker. The intended use: while
// building candidates call Allow for each upstream and mark the refused
// ones Unavailable ("breaker_open"); after Pick, Release the half-open
// probe claimed for any upstream that was not picked; report the picked
// upstream's result with Success or Failure.
package routing

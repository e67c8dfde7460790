// Package routing is the decision logic behind the `lb_policy llm`
// selection policy: given the prompt's size and, per upstream, how much of
// the prompt it holds in its KV cache and how loaded it is, pick the
// upstream where the request will wait least. It has no Caddy types and no
// I/O; the Caddy adapter fills the candidates from the upstream pool, the KV
// index, the approximate prefix tree and the engine registry.
//
// # Cost model
//
// Pick predicts, for every candidate, the request's time to first token
// (TTFT) there, from outstanding work in tokens rather than request
// counts, and takes the argmin of that prediction plus the fleet's work
// (following NVIDIA Dynamo's KV router, whose cost is uncached prefill
// blocks plus active blocks, and llm-d's latency predictor):
//
//	cached   = MatchedBlocks × BlockSize × trust        (trust 1 for Precise, ApproximateWeight for Approximate)
//	         + (CPUBlocks × CPUTierWeight + StorageBlocks × StorageTierWeight) × BlockSize   (Precise only)
//	prefill  = PromptTokens − cached                    (the request's own uncached prompt)
//	own      = Work.OwnPrefill                          (this gateway's requests there not yet at their first token)
//	due      = Work.OwnDueSeconds                       (until the last of them is predicted to reach it)
//	foreign  = max(Waiting − (OwnPending − Dispatched), 0) × MeanUncached   (waiting requests not ours)
//	decoding = running + queued − OwnPending − foreign requests
//	rate     = Work.PrefillRate less its steps (below), else PrefillRate    (faded into the peers': below)
//	step     = Work.StepSeconds, else StepSeconds                          (faded likewise)
//	step′    = the part of step taken out of the rate (below), else step
//	slot     = max(load + 1 − MaxInflight, 0) × (1 ÷ Work.DrainRate, else SlotSteps × step)
//	penalty  = (KVWeight × KVUsage² + AdapterWeight × share(Adapter)) ÷ PrefillRate
//	ahead    = due + foreign ÷ rate, or (own + foreign) ÷ rate without a due time
//	TTFT     = ahead + PrefixWeight × prefill ÷ rate + slot + step′ + penalty
//	cost     = TTFT + (RunningWeight × decoding + WorkWeight × prefill) ÷ PrefillRate
//
// The engine's counters time a prefill from scheduling to the first
// token, one step included, so its observed rate is taken as
// MeanUncached ÷ (MeanUncached ÷ Work.PrefillRate − taken), where taken
// is the step, at most half that mean prefill; the TTFT's step term is
// then taken (not the whole step), so a mean request is predicted its
// observed prefill time. The slot wait uses the whole step.
// MeanUncached is the engine's own mean uncached prompt (from its
// counters), else QueueWeight; running and queued are the gauges with the
// requests dispatched since the scrape added (to the queue when the engine
// was queueing, else to the running batch). Without gauges (LoadKnown
// false) foreign is 0 and decoding counts OwnDecoding (or Inflight less
// OwnPending). The caller records each request's prefill as its engine's
// work from dispatch to its first token (upstreams.Reservation.Work; for
// a response that is not streamed, to twice its predicted TTFT), so a
// request sent behind long prompts sees them, where counting requests saw
// a long prompt and a short one alike. Its due time is its dispatch plus
// its predicted TTFT (upstreams.Reservation.Predict) less any wait for a
// batch slot admission placed it to wait for (the slot term counts that
// queue for the next request), and the engine's is the latest of its
// pending requests': the engine has been working on them since they were
// sent, so a prefill about to end is a shorter wait than the same prompt
// just sent, which the tokens cannot tell apart. A first token that comes
// early or late moves the due time of the requests still pending by as
// much, since each was predicted behind those before it; without that, an
// engine with one request or another always pending looked busier with
// each one, as every new due time was set after the last.
// On the quality bench's prefix-low (real Caddy, 8 engines, 2,304-token
// prompts sharing 256 tokens, at the no-hit capacity) about every fifth
// request finds every engine prefilling; counting tokens it took any of
// them, and its TTFT p90 was 1.17 times round_robin's, whose cycle sends
// each request to the engine served longest ago. With due times it is
// even with round_robin. Once overdue (the engine is slower than
// predicted, or busy with other gateways' requests) the due time is
// unknown and the tokens count in full again.
//
// # Speeds that age
//
// Only traffic refreshes an engine's speeds, and at light load each
// request goes to the engine predicted fastest: an idle engine whose own
// figures read a little worse than its peers' (measured under load,
// before a restart or a sleep, or noise: the model's error is about 15%)
// would never get the request that shows it is as fast, and would starve.
// So its own speeds count f = max(1 − Work.SpeedAge ÷ 10 s, 0) against its
// peers':
//
//	1/rate = f ÷ own rate + (1 − f) ÷ peers' rate      (each less its step, as above)
//	step′  = f × own step′ + (1 − f) × peers' step′     (the slot wait's step likewise)
//
// The peers' speeds are one candidate's rate, MeanUncached and step (the
// median step where it has none): the weighted median, the lower of an
// even count, of the candidates that show a rate, ranked by how long the
// prompt's prefill would take there idle (prompt ÷ rate + step′), each
// weighted by its own f — or all alike when none is fresh. One engine's
// speeds rather than each figure's median, so that an engine predicted
// with them ties with that engine exactly; weighted, so that at light load
// (where only the engines that get requests are fresh) stale figures fade
// into the fresh ones, not into another idle engine's. A candidate that
// has shown no rate, or no MeanUncached, is predicted with the peers'
// (a rate and the mean it was observed on go together); without any
// peer's the configured figures apply. 10 s is a few default poll
// intervals (2 s), so a busy engine whose scrape happened to show no
// ended prefill barely moves. Measured on the fleet simulation (4 alike
// engines, about one request at a time: fleetsim's TestLightLoadFigures),
// on random prompts one engine got 1 of 300 requests before (its figures
// lacked the mean prompt that corrects the rate), 71 after; on
// prefix-high (seed 9) two engines got 29 and 43, 58 and 70 after, and
// the hit rate over three seeds went from 0.75 to 0.77. Near saturation
// (TestCostModelFigures), where every engine's speeds are fresh, TTFT p90
// moved between −6% and +3% and hit rates by at most 0.002. A relative
// tie tolerance matched to the
// model's error was the alternative: it would not resolve figures more
// than 15% off (an engine measured under load can read twice as slow),
// and would blur every decision, at every load, where aging only touches
// idle engines.
//
// Two terms are costs but not part of the prediction. The decoding
// sequences barely delay the request's prefill (their share of each step
// is in the step time), but they hold batch slots: an engine with more of
// them is the first to make the requests after this one wait for a slot.
// Measured on the fleet simulation (random prompts, 4 engines, 0.8 × the
// saturation rate, one seed), nearly leaving them out of the cost
// (RunningWeight 2) made TTFT p90 1.6 times round_robin's; putting them
// into the prediction made its median error 50% instead of 15%. WorkWeight prices the prefill the request adds to the fleet,
// at the reference rate: without it a burst of one long prefix spreads
// over every engine, each request faster by its few own tokens while the
// fleet computes the prefix again on each. The KV term is quadratic so it
// matters only near the preemption point; it and the adapter term are
// waits of their own, converted at the reference rate.
//
// The adapter term is for a request naming a LoRA adapter: vLLM batches
// at most --max-loras adapters, so a request whose adapter is not in
// flight on an engine whose slots are all taken waits for one and then for
// the adapter to load, while one joining its adapter's running requests
// waits for neither. It is a cost, not a filter, so a long prefix cached
// on an engine without the adapter can still win.
//
// Defaults (Config): PrefixWeight 1, WorkWeight 1, ApproximateWeight 0.7,
// QueueWeight 512, RunningWeight 64, PrefillRate 10000 tokens/s,
// StepSeconds 0.025, SlotSteps 32, KVWeight 1024, KVLimit 0.95,
// Epsilon 1.5, BoundedLoadMin 8, ImbalanceThreshold 32, TieTokens 8,
// AdapterWeight 8192, CPUTierWeight 0.75, StorageTierWeight 0.25 (NVIDIA
// Dynamo's host and disk credits). The cold-start figures (PrefillRate, StepSeconds,
// SlotSteps, QueueWeight) apply only until the engine's counters give its
// own; they are those of an 8B model on one modern GPU.
//
// # Worked example
//
// A 1,000-token prompt, block size 16 (62 full blocks), every rate at its
// default. Replica A holds 50 blocks (800 tokens, precise) and has 2
// running, 1 waiting (not this gateway's), KV usage 0.3; replica B holds
// nothing and is idle:
//
//	A: TTFT (512 + 200 + 92.16) / 10000 + 0.025 = 0.1054 s, cost 0.1054 + 128/10000 + 200/10000 = 0.1382
//	B: TTFT 1000 / 10000 + 0.025              = 0.1250 s, cost 0.1250 + 1000/10000            = 0.2250
//
// A wins (Outcome Hit, Share 50/62 ≈ 0.81). With a second waiting request
// A's cost is 0.1894 and it still wins: each saved token counts twice
// (the wait and the fleet's work), so 800 saved tokens buy 3.1 waiting
// requests of 512. Had B held the same 50 blocks only approximately, it
// would be credited 560 tokens and cost 0.1130, beating the busier
// precise holder. Had this gateway just sent A long unique prompts still
// prefilling, 6,000 more tokens ahead would add 0.6 s to A's TTFT and B
// would win, whatever the request counts.
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
// Measured on the fleet simulation with the token cost (prefix-low,
// random and prefix-high shapes, 4 engines, up to past round_robin's
// saturation), neither rule ever fired: the cost alone kept the loads
// within them. They stay as the safety net they were meant to be, for
// the hot spots those workloads do not make (one very popular prefix).
// Exact ties instead of TieTokens changed TTFT p90 by less than the
// seeds' spread. WorkWeight 0 made prefix-high's p90 lower by up to 40%
// there, but let a burst of one new prefix spread over most engines
// (its later requests' hit rate fell from 83% to 68%); 0.5 gained
// nothing over 1.
//
// # Ties and outcomes
//
// Costs within TieTokens ÷ PrefillRate seconds of the cheapest are ties, broken by rendezvous
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

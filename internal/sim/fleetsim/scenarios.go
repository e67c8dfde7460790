package fleetsim

import (
	"slices"
	"strconv"
)

// The scenarios of issue 13 in which only the engines know what they hold:
// traffic that bypasses the gateway (Params.BypassShare, Params.Warm) and
// engine restarts (Params.RestartEvery). Params.Approximate runs the
// gateway without KV events, to compare.

// start begins the run: the warm-up's requests when Params.Warm, else the
// user traffic at once.
func (s *fleetSim) start() {
	p := s.p
	if !p.Warm {
		s.startTraffic()
		return
	}
	s.warming = len(s.groups)
	for g := range s.groups {
		r := &desReq{id: s.nextID, group: g, burst: -1, qseed: s.crng.Uint64(), arrival: s.now,
			maxTokens: p.OutputTokens, promptLen: p.SystemTokens + p.QuestionTokens, direct: true, warm: true}
		s.nextID++
		s.materialize(r)
		s.send(r, s.crng.IntN(len(s.engines)))
	}
}

// startTraffic schedules the first user arrival now and, with
// Params.RestartEvery, the first restart.
func (s *fleetSim) startTraffic() {
	s.push(s.now+s.traceAt(0), evArrival, -1)
	if s.p.RestartEvery > 0 {
		s.push(s.now+s.p.RestartEvery, evRestart, 0)
	}
}

// warmed ends a warm-up request; the last one starts the user traffic.
func (s *fleetSim) warmed(r *desReq) {
	s.res.Warmed++
	r.drop()
	if s.warming--; s.warming == 0 {
		s.startTraffic()
	}
}

// bypasses draws whether the arriving request's caller sends it straight
// to an engine. It draws from crng, and only when some do, so that the
// workload is that of a run without bypass.
func (s *fleetSim) bypasses() bool {
	return s.p.BypassShare > 0 && s.crng.Float64() < s.p.BypassShare
}

// outstanding reports whether some request is still neither completed,
// rejected nor failed.
func (s *fleetSim) outstanding() bool {
	return s.res.Completed+s.res.Rejected+s.res.Failed < s.p.Requests
}

// restartNext restarts engine idx, schedules the next engine's restart
// while requests are outstanding, and lets the gate admit into the
// capacity the lost requests' reservations held.
func (s *fleetSim) restartNext(idx int) error {
	s.restart(s.engines[idx])
	if s.outstanding() {
		s.push(s.now+s.p.RestartEvery, evRestart, (idx+1)%len(s.engines))
	}
	return s.unpark()
}

// restart is an engine process restarting, instantly for simplicity: what
// ran or queued there is lost, and the new process starts with an empty
// cache. It publishes no AllBlocksCleared (vLLM emits that only on
// reset_prefix_cache); it numbers its event batches from 0 again, and the
// gateway's feed takes a sequence going backwards for a restart and clears
// the engine's mirror, at the new process's first batch. The approximate
// tree learns nothing from it.
func (s *fleetSim) restart(e *desEngine) {
	s.res.Restarts++
	for _, r := range slices.Concat(e.running, e.waiting) {
		s.fail(r)
	}
	e.restart()
}

// fail ends a request lost to a restart. Its gateway sees its connection
// drop: the reservation ends and, for lb_policy llm, the failure is
// reported to that gateway's fleet (dropping the engine's speculative
// entries there; the other gateways learn of the restart from the engine's
// events and gauges). Requests are not
// retried, so that each arrival is one completion, rejection or failure.
func (s *fleetSim) fail(r *desReq) {
	if r.res != nil {
		r.res.Done()
		if s.p.Policy == PolicyLLM {
			r.attempt.Failed()
		}
	}
	s.res.Failed++
	r.drop()
}

// drop lets go of a done request's buffers; the gate's event may still
// hold the request's waiter, so the request itself lingers.
func (r *desReq) drop() {
	r.tokens, r.hashes, r.blocks, r.res, r.place, r.waiter, r.text = nil, nil, nil, nil, nil, nil, nil
	r.attempt = nil
}

// promptText renders a prompt's token ids as a completion request's text
// prompt (a JSON string of the ids), so that prompts sharing leading
// tokens share a leading text, which is what the approximate tree keys on.
func promptText(tokens []uint64) []byte {
	b := make([]byte, 0, 7*len(tokens)+2)
	b = append(b, '"')
	for i, t := range tokens {
		if i > 0 {
			b = append(b, ' ')
		}
		b = strconv.AppendUint(b, t, 10)
	}
	return append(b, '"')
}

package main

import (
	"math"
	"slices"
	"strings"
	"testing"
)

func TestSplitWarm(t *testing.T) {
	var sessions []Session
	for _, k := range []string{"a", "b", "a", "a", "c", "b", "a", "b", "c"} {
		sessions = append(sessions, Session{Key: k})
	}
	keys := func(ss []Session) string {
		var b strings.Builder
		for _, s := range ss {
			b.WriteString(s.Key)
		}
		return b.String()
	}
	// Each group's first two in order warm up; of the rest, the first
	// three in order are compared.
	warm, rest := splitWarm(sessions, 2, 3)
	if got := keys(warm); got != "abacbc" {
		t.Errorf("warm = %q, want abacbc", got)
	}
	if got := keys(rest); got != "aab" {
		t.Errorf("compared = %q, want aab", got)
	}
}

func TestExplainPicked(t *testing.T) {
	pick := "e2"
	a := explainAnswer{Tokens: 2317, BlockSize: 16, Pick: &pick}
	a.Candidates = []explainCandidate{
		{Dial: "e1", Tier: "precise", MatchedBlocks: 128},
		{Dial: "e2", Tier: "precise", MatchedBlocks: 144, SpeculativeBlocks: 16},
		// The approximate tree's guesses are no knowledge of the engines.
		{Dial: "e3", Tier: "approximate", MatchedBlocks: 144},
	}
	got := a.picked()
	want := PickedBlocks{Prompt: 144, Picked: 128, Best: 128, Pick: "e2"}
	if got != want {
		t.Errorf("picked = %+v, want %+v", got, want)
	}
	a.Pick, a.TokenizeError = nil, "timeout"
	if got := a.picked(); got.Picked != 0 || got.Pick != "" || got.Err != "tokenize: timeout" {
		t.Errorf("no pick: %+v", got)
	}
}

func TestCaughtUp(t *testing.T) {
	seq := func(v uint64) *uint64 { return &v }
	state := func(dial string, last *uint64) kvState {
		s := kvState{Dial: dial}
		s.KV = &struct {
			LastSeq *uint64 `json:"last_seq"`
			Blocks  int     `json:"blocks"`
		}{LastSeq: last}
		return s
	}
	dials := []string{"e1", "e2"}
	for _, tc := range []struct {
		name      string
		published []uint64
		base      []uint64
		states    []kvState
		want      bool
	}{
		{"every batch applied", []uint64{3, 1}, nil, []kvState{state("e1", seq(2)), state("e2", seq(0))}, true},
		{"one batch behind", []uint64{3, 1}, nil, []kvState{state("e1", seq(1)), state("e2", seq(0))}, false},
		{"nothing published", []uint64{0, 0}, nil, []kvState{state("e1", nil), state("e2", nil)}, true},
		{"a stream not yet seen", []uint64{3, 1}, nil, []kvState{state("e1", seq(2)), state("e2", nil)}, false},
		// A gateway that subscribed after an engine's last batch has
		// nothing to wait for from it.
		{"silent since subscribing", []uint64{3, 5}, []uint64{0, 5}, []kvState{state("e1", seq(2)), state("e2", nil)}, true},
		{"new since subscribing", []uint64{3, 6}, []uint64{0, 5}, []kvState{state("e1", seq(2)), state("e2", nil)}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := caughtUp(dials, tc.published, tc.base, tc.states); got != tc.want {
				t.Errorf("caughtUp = %v, want %v", got, tc.want)
			}
		})
	}
}

// row is a compared request in brief: the new and the reference
// gateway's picked blocks of 10, the TTFT and where the request went.
type row struct {
	group    string
	nw, ref  int
	ttft     float64
	upstream string
}

// lateJoinRows builds compared requests: the new gateway picks e1, the
// reference e2, and the engine hit what the reference's pick holds.
func lateJoinRows(rows ...row) []LateJoinRow {
	var out []LateJoinRow
	for _, r := range rows {
		out = append(out, LateJoinRow{Group: r.group, TTFT: r.ttft, Prompt: 160, Cached: r.ref * 16, Upstream: r.upstream,
			New: PickedBlocks{Prompt: 10, Picked: r.nw, Best: r.nw, Pick: "e1"},
			Ref: PickedBlocks{Prompt: 10, Picked: r.ref, Best: r.ref, Pick: "e2"}})
	}
	return out
}

func TestSummarizeHits(t *testing.T) {
	rows := lateJoinRows(row{"a", 0, 8, 0.3, "e1"}, row{"a", 8, 8, 0.1, "e1"}, row{"b", 0, 8, 0.3, "e2"}, row{"b", 4, 8, 0.1, "e1"})
	rows = append(rows, LateJoinRow{Group: "b", New: PickedBlocks{Err: "status 503"}, Ref: PickedBlocks{Prompt: 10, Picked: 8}})
	nw, ref := summarizeHits(rows, newSide, nil), summarizeHits(rows, refSide, nil)
	// The row the new gateway could not explain counts for neither.
	if nw.Requests != 4 || nw.Errors != 1 || nw.Prompt != 40 || nw.Picked != 12 || nw.Holding != 2 {
		t.Errorf("new = %+v", nw)
	}
	if ref.Requests != 4 || ref.Picked != 32 || math.Abs(ref.rate()-0.8) > 1e-9 || ref.holdingShare() != 1 {
		t.Errorf("reference = %+v", ref)
	}
	if math.Abs(nw.rate()-0.3) > 1e-9 || nw.holdingShare() != 0.5 {
		t.Errorf("new rate %v, holding %v", nw.rate(), nw.holdingShare())
	}
	first := firstSightings(rows)
	if want := []bool{true, false, true, false, false}; !slices.Equal(first, want) {
		t.Errorf("first sightings = %v, want %v", first, want)
	}
	past := summarizeHits(rows, newSide, func(i int) bool { return !first[i] })
	if past.Requests != 2 || past.Picked != 12 {
		t.Errorf("past first sightings = %+v", past)
	}
}

func TestSummarizeRouted(t *testing.T) {
	c := LateJoinCase{NewRoutes: true, Rows: lateJoinRows(row{"a", 0, 8, 0.3, "e1"}, row{"a", 8, 8, 0.1, "e3"}, row{"b", 8, 8, 0.2, "e1"})}
	c.Rows = append(c.Rows, LateJoinRow{Group: "b", Err: "status 503"})
	s := summarizeRouted(c)
	// The new gateway routed: its picks (e1) are compared with where the
	// requests went.
	if s.Failed != 1 || s.TTFT.N != 3 || s.TTFT.P50 != 0.2 || s.Agree != 2 || s.Picks != 3 || math.Abs(s.EngineHit-0.8) > 1e-9 {
		t.Errorf("routed = %+v", s)
	}
	c.NewRoutes = false
	if s := summarizeRouted(c); s.Agree != 0 {
		t.Errorf("reference routed: %d requests went to its pick e2, want 0", s.Agree)
	}
}

func TestRenderLateJoin(t *testing.T) {
	rows := lateJoinRows(row{"a", 0, 8, 0.3, "e1"}, row{"a", 8, 8, 0.1, "e1"}, row{"b", 0, 8, 0.3, "e1"}, row{"b", 8, 8, 0.1, "e1"})
	q := &QualityResult{LateJoin: []LateJoinResult{{Workload: "late-join", AppBody: "hash_seed 0", Rejected: []string{"hash_algo sha256_cbor"}, Warm: 40,
		Cases: []LateJoinCase{{Name: "late, observing", Rows: rows, NewBlocks: 10, RefBlocks: 20},
			{Name: "restart", NewRoutes: true, Restart: true, Rows: rows, NewBlocks: 10, RefBlocks: 20}}}}}
	qw := QualityWorkload{Spec: WorkloadSpec{Name: "late-join"}, Scenario: &ScenarioOptions{Desc: "desc", Why: "why", LateJoin: &LateJoinOptions{}}}
	var b strings.Builder
	renderScenario(&b, q, qw)
	for _, want := range []string{
		"### late-join\n\ndesc\n\n",
		"Every gateway ran with the app options `hash_seed 0`. This build rejected `hash_algo sha256_cbor` as unknown",
		"| late, observing | early | 40.0% | 80.0% | **0.50×** | 1.00× | 2 of 4 | 40.0% / 80.0% (2 first sightings) | 50% / 100% | 80.0% | 0.10 s | 0.30 s | 0.20 s | 0 | 0/4 | 10 / 20 |\n",
		"| restart | restarted | 40.0% | 80.0% | **0.50×** | 1.00× | 2 of 4 | 40.0% / 80.0% (2 first sightings) | 50% / 100% | 80.0% | 0.10 s | 0.30 s | 0.20 s | 0 | 4/4 | 10 / 20 |\n",
		"The warm-up sends 40 requests", "the next 4 requests go one at a time",
		"Why: why\n",
	} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("no %q in:\n%s", want, b.String())
		}
	}
	goals := lateJoinGoals(q)
	want := "late-join, restart: the restarted gateway's precise hit rate over its first 4 requests 40.0% = 0.50× the reference gateway's 80.0% over the same requests (below the goal of 0.95×; 2 of them first sightings); gateways without hash_algo sha256_cbor"
	if len(goals) != 1 || goals[0] != want {
		t.Errorf("goals = %q, want [%q]", goals, want)
	}
}

func TestUnknownOption(t *testing.T) {
	out := `Error: adapting config using caddyfile: parsing caddyfile tokens for 'llm': unrecognized llm subdirective 'hash_algo', at probe.Caddyfile:3`
	if !unknownOption(out) || unknownOption("Error: loading config: invalid duration") {
		t.Error("unknownOption does not tell an unknown option from another error")
	}
}

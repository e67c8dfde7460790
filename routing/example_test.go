package routing_test

import (
	"fmt"

	"github.com/llmgw/caddy-llmgw/routing"
)

// The package documentation's worked example: a 1,000-token prompt; replica
// A holds 50 blocks but is busy, replica B is idle and holds nothing.
func ExamplePick() {
	req := routing.Request{PromptTokens: 1000, BlockSize: 16, TotalBlocks: 62, Key: 1}
	cands := []routing.Candidate{
		{Dial: "a:8000", Tier: routing.Precise, MatchedBlocks: 50, Running: 2, Waiting: 1, KVUsage: 0.3, LoadKnown: true},
		{Dial: "b:8000", LoadKnown: true},
	}
	d := routing.Pick(req, cands, routing.Config{}, true)
	fmt.Printf("A %.4f, B %.4f -> %s %v share %.2f\n", d.Scored[0].Cost, d.Scored[1].Cost, cands[d.Index].Dial, d.Outcome, d.Share)

	cands[0].Waiting = 2 // one more request (not this gateway's) queued at A
	d = routing.Pick(req, cands, routing.Config{}, true)
	fmt.Printf("A %.4f, B %.4f -> %s %v\n", d.Scored[0].Cost, d.Scored[1].Cost, cands[d.Index].Dial, d.Outcome)

	cands[1].Tier, cands[1].MatchedBlocks = routing.Approximate, 50 // B probably holds it too
	d = routing.Pick(req, cands, routing.Config{}, true)
	fmt.Printf("A %.4f, B %.4f -> %s %v %v\n", d.Scored[0].Cost, d.Scored[1].Cost, cands[d.Index].Dial, d.Outcome, d.Tier)
	// Output:
	// A 0.1382, B 0.2250 -> a:8000 hit share 0.81
	// A 0.1894, B 0.2250 -> a:8000 hit
	// A 0.1894, B 0.1130 -> b:8000 overridden_by_load approximate
}

// Rendezvous keeps a key on its dial while the fleet is unchanged.
func ExampleRendezvous() {
	dials := []string{"10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000"}
	i := routing.Rendezvous("session-42", dials)
	fmt.Println(i == routing.Rendezvous("session-42", dials))
	// Output: true
}

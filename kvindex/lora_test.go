package kvindex

import (
	"fmt"
	"testing"
)

// TestIsLoRA: adapter names are learnt from BlockStored's lora_name, a
// request for the adapter then matches the blocks stored under it (its
// name hashed on every block), and the set is bounded.
func TestIsLoRA(t *testing.T) {
	ix := NewIndex(IndexConfig{})
	_, f := newTestFeed(t, ix, "e1", nil)
	e := newEngineSim(t, "0", 4)
	p := prompt(16, 21)
	if ix.IsLoRA("sql-adapter") || ix.IsLoRA("") {
		t.Fatal("names known before any event")
	}
	ev := e.stored(p, RequestExtraKeys("sql-adapter", "", 4), 0, 4)
	ev[7] = "sql-adapter" // lora_name
	e.msg(f, ev)
	base := e.stored(p, nil, 0, 2)
	e.msg(f, base)
	if !ix.IsLoRA("sql-adapter") {
		t.Fatal("adapter not learnt from lora_name")
	}
	if ix.IsLoRA("sim-model") || ix.IsLoRA("") {
		t.Fatal("a name never seen as lora_name is an adapter")
	}
	wantMatch(t, ix, Query{Tokens: p, LoRAName: "sql-adapter"}, map[string]int{"e1": 4})
	wantMatch(t, ix, Query{Tokens: p}, map[string]int{"e1": 2})

	// A stream naming ever new adapters cannot grow the set without bound.
	for i := range maxLoRANames + 50 {
		ev := arr{"BlockStored", arr{uint64(1000 + i)}, nil, arr{1, 2, 3, 4}, 4, nil, "GPU", fmt.Sprintf("lora-%d", i)}
		e.msg(f, ev)
	}
	ix.mu.RLock()
	n := len(ix.loras)
	ix.mu.RUnlock()
	if n != maxLoRANames {
		t.Fatalf("%d names remembered, want the cap %d", n, maxLoRANames)
	}
	if !ix.IsLoRA("lora-0") || ix.IsLoRA(fmt.Sprintf("lora-%d", maxLoRANames+10)) {
		t.Fatal("names beyond the cap must be ignored, earlier ones kept")
	}
}

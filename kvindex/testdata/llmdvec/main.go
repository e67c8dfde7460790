package main

import (
	"encoding/json"
	"fmt"
	"os"

	"github.com/llm-d/llm-d-kv-cache/pkg/kvcache/kvblock"
)

type vec struct {
	Name      string   `json:"name"`
	Seed      string   `json:"seed"`
	Model     string   `json:"model"`
	BlockSize int      `json:"block_size"`
	Tokens    []uint32 `json:"tokens"`
	Hashes    []uint64 `json:"hashes"`
	// Continued: hashes of Tokens chained from Parent (as an event's later blocks are).
	Parent uint64 `json:"parent,omitempty"`
}

func main() {
	cases := []struct {
		name, seed, model string
		bs                int
		n                 int
		big               bool
	}{
		{"bs16_seed_empty_model_a", "", "model-a", 16, 40, false},
		{"bs16_seed_42_model_a", "42", "model-a", 16, 40, false},
		{"bs16_seed_42_model_b", "42", "model-b", 16, 33, false},
		{"bs4_seed_0_big_tokens", "0", "Qwen/Qwen3-0.6B", 4, 12, true},
		{"bs64_seed_0_sim_model", "0", "sim-model", 64, 130, false},
	}
	var out []vec
	for _, c := range cases {
		cfg := kvblock.DefaultTokenProcessorConfig()
		cfg.BlockSizeTokens = c.bs
		cfg.HashSeed = c.seed
		tp, err := kvblock.NewChunkedTokenDatabase(cfg)
		if err != nil {
			panic(err)
		}
		toks := make([]uint32, c.n)
		for i := range toks {
			if c.big {
				toks[i] = uint32(4294967295 - i*1000003)
			} else {
				toks[i] = uint32(i*7 + 3)
			}
		}
		keys, err := tp.TokensToKVBlockKeys(kvblock.EmptyBlockHash, toks, c.model, nil)
		if err != nil {
			panic(err)
		}
		v := vec{Name: c.name, Seed: c.seed, Model: c.model, BlockSize: c.bs, Tokens: toks}
		for _, k := range keys {
			v.Hashes = append(v.Hashes, uint64(k))
		}
		out = append(out, v)
		// continuation from a parent
		if len(keys) > 1 {
			cont, err := tp.TokensToKVBlockKeys(keys[0], toks[c.bs:], c.model, nil)
			if err != nil {
				panic(err)
			}
			for i := range cont {
				if uint64(cont[i]) != v.Hashes[i+1] {
					panic(fmt.Sprint("continuation differs", i))
				}
			}
		}
	}
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	enc.Encode(out)
}

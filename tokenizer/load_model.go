package tokenizer

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
)

// buildModel checks the model section and builds the BPE model.
func buildModel(mj *modelJSON) (*bpeModel, error) {
	if mj.Type != "BPE" && !(mj.Type == "" && mj.Merges != nil) {
		return nil, unsupported("model", mj.Type)
	}
	if mj.Dropout != nil && *mj.Dropout != 0 {
		return nil, fmt.Errorf("tokenizer: BPE dropout %v is not supported (encoding would be random)", *mj.Dropout)
	}
	vocab, ok := fastVocab(mj.Vocab)
	if !ok {
		if err := json.Unmarshal(mj.Vocab, &vocab); err != nil {
			return nil, fmt.Errorf("tokenizer: model vocab: %w", err)
		}
	}
	m := &bpeModel{
		unkID:        -1,
		fuseUnk:      mj.FuseUnk,
		byteFallback: mj.ByteFallback,
		ignoreMerges: mj.IgnoreMerges,
		cache:        newWordCache(),
	}
	if mj.ContinuingSubwordPrefix != nil {
		m.prefix = *mj.ContinuingSubwordPrefix
	}
	if mj.EndOfWordSuffix != nil {
		m.suffix = *mj.EndOfWordSuffix
	}
	if err := m.setVocab(vocab); err != nil {
		return nil, err
	}
	if mj.UnkToken != nil {
		// An unk token missing from the vocabulary is treated as none:
		// unknown characters are then dropped, as HF's JS port does.
		m.unkID = m.idOr(*mj.UnkToken)
	}
	if err := m.setMerges(mj.Merges); err != nil {
		return nil, err
	}
	m.lookupTables()
	m.setupBoundarySplit()
	return m, nil
}

// setVocab builds the model's vocabulary, rejecting negative or huge ids.
func (m *bpeModel) setVocab(vocab map[string]int64) error {
	for tok, id := range vocab {
		if id < 0 || id >= maxTokenID {
			return fmt.Errorf("tokenizer: vocab token %q has id %d, outside [0, %d)", tok, id, maxTokenID)
		}
	}
	m.vocab = newVocabTable(vocab)
	return nil
}

// setMerges parses merges given either as "a b" strings or as [a, b] pairs
// and indexes them by id pair.
func (m *bpeModel) setMerges(raw json.RawMessage) error {
	pairs, err := parseMerges(raw)
	if err != nil {
		return err
	}
	m.merges = make(map[uint64]uint64, len(pairs))
	var buf []byte
	for rank, p := range pairs {
		a, okA := m.vocab.get(p[0])
		b, okB := m.vocab.get(p[1])
		if !okA || !okB {
			return fmt.Errorf("tokenizer: merge %d (%q %q) names a token that is not in the vocab", rank, p[0], p[1])
		}
		if !strings.HasPrefix(p[1], m.prefix) {
			return fmt.Errorf("tokenizer: merge %d (%q %q): second token lacks the continuing_subword_prefix %q", rank, p[0], p[1], m.prefix)
		}
		buf = append(append(buf[:0], p[0]...), p[1][len(m.prefix):]...)
		merged, ok := m.vocab.getBytes(buf)
		if !ok {
			return fmt.Errorf("tokenizer: merge %d (%q %q) makes a token that is not in the vocab", rank, p[0], p[1])
		}
		// A repeated pair keeps its last rank, as HF's map-building does.
		m.merges[pairKey(a, b)] = uint64(rank)<<32 | uint64(uint32(merged))
	}
	return nil
}

// parseMerges accepts both merge formats.
func parseMerges(raw json.RawMessage) ([][2]string, error) {
	raw = bytes.TrimSpace(raw)
	if isNull(raw) {
		return nil, nil
	}
	if pairs, ok := fastMerges(raw); ok {
		return pairs, nil
	}
	return slowMerges(raw)
}

// slowMerges is parseMerges through encoding/json, for what fastMerges
// does not handle and for its error messages.
func slowMerges(raw json.RawMessage) ([][2]string, error) {
	inner := bytes.TrimSpace(bytes.TrimPrefix(bytes.TrimSpace(raw), []byte("[")))
	if len(inner) > 0 && inner[0] == '[' {
		var lists [][]string
		if err := json.Unmarshal(raw, &lists); err != nil {
			return nil, fmt.Errorf("tokenizer: model merges: %w", err)
		}
		pairs := make([][2]string, len(lists))
		for i, l := range lists {
			if len(l) != 2 {
				return nil, fmt.Errorf("tokenizer: merge %d has %d parts, want 2", i, len(l))
			}
			pairs[i] = [2]string{l[0], l[1]}
		}
		return pairs, nil
	}
	var lines []string
	if err := json.Unmarshal(raw, &lines); err != nil {
		return nil, fmt.Errorf("tokenizer: model merges: %w", err)
	}
	pairs := make([][2]string, len(lines))
	for i, l := range lines {
		a, b, ok := strings.Cut(l, " ")
		if !ok || strings.Contains(b, " ") {
			return nil, fmt.Errorf("tokenizer: merge %d (%q) is not two tokens separated by one space", i, l)
		}
		pairs[i] = [2]string{a, b}
	}
	return pairs, nil
}

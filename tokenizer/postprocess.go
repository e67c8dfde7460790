package tokenizer

import "fmt"

// templateItem is one element of a single-sequence template: either fixed
// ids (a special token, which may stand for several ids) or the encoded
// text itself.
type templateItem struct {
	ids []int
	seq bool
}

// template is what addSpecialTokens=true wraps around the encoded text.
// HF's ByteLevel post-processor only adjusts offsets, so it contributes
// nothing here; TemplateProcessing, BertProcessing and RobertaProcessing
// add their tokens, and a Sequence nests them.
type template []templateItem

// identityTemplate is the text alone.
var identityTemplate = template{{seq: true}}

// compose returns the template of applying t to what inner produced.
func (t template) compose(inner template) template {
	var out template
	for _, it := range t {
		if it.seq {
			out = append(out, inner...)
		} else {
			out = append(out, it)
		}
	}
	return out
}

// apply appends the template's ids to dst, calling encode for the text.
// The text is encoded once even if the template names it twice.
func (t template) apply(dst []int, encode func([]int) []int) []int {
	first, firstEnd := -1, -1
	for _, it := range t {
		if !it.seq {
			dst = append(dst, it.ids...)
			continue
		}
		if first < 0 {
			first = len(dst)
			dst = encode(dst)
			firstEnd = len(dst)
			continue
		}
		dst = append(dst, dst[first:firstEnd]...)
	}
	return dst
}

// WithBOSEOS returns a tokenizer that shares t's vocabulary and caches but
// whose addSpecialTokens template is bos, the text, eos, where an empty
// name adds nothing: the post-processor transformers' LlamaTokenizerFast
// and GemmaTokenizerFast build at load time from tokenizer_config.json's
// add_bos_token and add_eos_token, replacing tokenizer.json's own. Both
// tokens must be in the vocabulary.
func (t *Tokenizer) WithBOSEOS(bos, eos string) (*Tokenizer, error) {
	var tmpl template
	if bos != "" {
		id, ok := t.TokenToID(bos)
		if !ok {
			return nil, fmt.Errorf("tokenizer: bos token %q is not in the vocabulary", bos)
		}
		tmpl = append(tmpl, templateItem{ids: []int{id}})
	}
	tmpl = append(tmpl, templateItem{seq: true})
	if eos != "" {
		id, ok := t.TokenToID(eos)
		if !ok {
			return nil, fmt.Errorf("tokenizer: eos token %q is not in the vocabulary", eos)
		}
		tmpl = append(tmpl, templateItem{ids: []int{id}})
	}
	c := *t
	c.template = tmpl
	return &c, nil
}

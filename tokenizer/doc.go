// Package tokenizer encodes text into token ids exactly as Hugging Face
// tokenizers does, from a model's tokenizer.json, so that the gateway can
// route on prompt prefixes without asking the engine's /tokenize endpoint.
// A single differing id would send a request to a replica without its
// cached prefix, so the package aims at bit-for-bit agreement: it is
// checked against @huggingface/tokenizers (the JS port) on the tokenizers
// of Qwen 3, Llama 3.1, DeepSeek V3, GPT-OSS, Gemma 3 and Llama 2.
//
// Parse or LoadFile a tokenizer.json once; a *Tokenizer is then safe for
// concurrent use. Encode runs the pipeline of HF's Rust library:
//
//  1. added tokens (special or not) with normalized=false are cut out of
//     the raw text, leftmost and longest first, honouring single_word,
//     lstrip and rstrip;
//  2. each stretch between them is normalized, and added tokens with
//     normalized=true are cut out of the result;
//  3. the rest is pre-tokenized and each piece encoded by the model;
//  4. with addSpecialTokens, the post-processor's template is applied.
//
// Supported components:
//
//   - normalizers: NFC, NFD, NFKC, NFKD, Lowercase, Strip, StripAccents,
//     Prepend, Replace (String or Regex), Sequence;
//   - pre-tokenizers: ByteLevel (add_prefix_space, use_regex with GPT-2's
//     pattern), Split (String or Regex; Removed, Isolated,
//     MergedWithPrevious, MergedWithNext, Contiguous; invert), Metaspace
//     (replacement, prepend_scheme always/first/never, split), Digits,
//     Whitespace, WhitespaceSplit, Punctuation, BertPreTokenizer,
//     CharDelimiterSplit, Sequence;
//   - model: BPE (merges as "a b" strings or [a, b] pairs, ignore_merges,
//     byte_fallback, unk_token with fuse_unk, continuing_subword_prefix,
//     end_of_word_suffix);
//   - post-processors: ByteLevel (which changes no ids), TemplateProcessing
//     (the single template), BertProcessing, RobertaProcessing, Sequence;
//   - decoders: ByteLevel, ByteFallback, Fuse, Strip, Replace, Metaspace,
//     BPEDecoder, Sequence.
//
// Anything else fails to load with an error naming it, for example
// `tokenizer: pre_tokenizer "UnicodeScripts" is not supported`: WordPiece,
// Unigram and WordLevel models, BPE dropout (encoding would be random),
// the BertNormalizer and Precompiled normalizers, and the WordPiece and CTC
// decoders. Pair templates are not used since Encode takes one text.
//
// Split regexes: Go's regexp has no look-ahead, which the GPT-style
// patterns need for `\s+(?!\S)`. The patterns of GPT-2, cl100k/Llama 3,
// Qwen 2/3, o200k/GPT-OSS and DeepSeek V3 are recognised by their exact
// text and run by hand-written scanners (split_patterns.go), which tests
// and a fuzz target compare with regexp2. Other patterns run on regexp2, a
// backtracking engine whose .NET syntax agrees with Oniguruma on what
// these patterns use (\s is Unicode White_Space, \p{..} are general
// categories); simple (?i:...) groups are folded to ASCII classes first,
// as HF's engines effectively do. Patterns using Oniguruma-only syntax
// (possessive quantifiers, script names in \p{..}) fail to load.
//
// Where HF's Rust library and its JS port disagree on a rule that real
// tokenizers do not exercise, this package follows Rust, which is what
// vLLM runs: Metaspace honours split, Punctuation isolates each rune,
// Lowercase has no final-sigma rule, fuse_unk works within a piece, and a
// stretch of text equal to an added token is not turned into it unless the
// token matcher found it there.
//
// Limits and conventions:
//
//   - Character properties come from Go's unicode package (Unicode 15.0),
//     normalization from golang.org/x/text. Characters assigned in later
//     Unicode versions (some 2024 emoji, CJK extension I) may split
//     differently from an engine built on newer data: the JS reference on
//     Node 20 uses Unicode 17.
//   - golang.org/x/text's normalization follows the Stream-Safe Text Format
//     and puts U+034F after every 30 combining marks in a row, which HF's
//     engines do not; text with longer runs of marks ("zalgo" text) may get
//     different ids under an NFC/NFD/NFKC/NFKD normalizer.
//   - Invalid UTF-8 in the text is read as one U+FFFD per bad byte, the
//     way a Go range loop sees it.
//   - Decode skips ids that name no token. It applies no
//     clean_up_tokenization_spaces pass; that belongs to Python's
//     transformers, not to the tokenizers library.
//   - Encoding keeps a bounded cache of piece -> ids (about 64k pieces of up
//     to 256 bytes) per Tokenizer, and scratch buffers come from a
//     package-level sync.Pool; there is no other shared mutable state.
//   - Long pieces of SentencePiece-style tokenizers (no pre-tokenizer,
//     spaces as ▁) are cut before ▁ wherever no vocabulary token could span
//     the cut, which leaves the ids unchanged and makes them cacheable.
package tokenizer

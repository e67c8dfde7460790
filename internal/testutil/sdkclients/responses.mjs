// responses.mjs <base URL> [model] — the OpenAI Node SDK's Responses API
// through the gateway: one client.responses.create, one streamed (stream:
// true, every event read), then 20 follow-ups, each with the
// previous_response_id of the last one answered (alternately streamed).
// Prints one JSON line per request: its step, id, previous_response_id,
// output text and the gateway's X-LLM-Upstream header, or its error.
import { attempt, baseURL, model, sdk } from './common.mjs';

const { OpenAI } = sdk('openai');
const client = new OpenAI({ baseURL: baseURL() + '/v1', apiKey: 'sk-test', maxRetries: 0, timeout: 10_000 });
const FOLLOW_UPS = 20;

/** create sends one non-streaming request. */
async function create(params) {
  const { data, response } = await client.responses.create(params).withResponse();
  return { id: data.id, status: data.status, text: data.output_text, usage: data.usage, upstream: response.headers.get('x-llm-upstream') };
}

/** stream sends one streaming request and reads every event. */
async function stream(params) {
  const { data: events, response } = await client.responses.create({ ...params, stream: true }).withResponse();
  let text = '', id = null, status = null, usage = null, count = 0;
  const types = new Set();
  for await (const ev of events) {
    count++;
    types.add(ev.type);
    if (ev.type === 'response.output_text.delta') text += ev.delta;
    if (ev.type === 'response.created') id = ev.response.id;
    if (ev.type === 'response.completed') ({ id, status, usage } = ev.response);
  }
  return { id, status, text, usage, events: count, types: [...types], upstream: response.headers.get('x-llm-upstream') };
}

const base = { model: model(), max_output_tokens: 8 };
await attempt('create', () => create({ ...base, input: 'Say hello.' }));
let prev = (await attempt('stream', () => stream({ ...base, input: 'Say hello, streaming.' })))?.id;
for (let i = 1; i <= FOLLOW_UPS; i++) {
  const params = { ...base, input: `Follow-up ${i}: and then?`, previous_response_id: prev };
  const send = i % 2 ? create : stream;
  const out = await attempt('followup', () => send(params), { n: i, previous: prev, streamed: send === stream });
  if (out?.id) prev = out.id;
}

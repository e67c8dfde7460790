// embeddings.mjs <base URL> [model] — the OpenAI Node SDK's
// client.embeddings.create through the gateway, two inputs, once with the
// SDK's default encoding (base64, decoded by the SDK) and once as floats.
// Prints one JSON line per request: each vector's index and length, and
// the usage.
import { attempt, baseURL, model, sdk } from './common.mjs';

const { OpenAI } = sdk('openai');
const client = new OpenAI({ baseURL: baseURL() + '/v1', apiKey: 'sk-test', maxRetries: 0, timeout: 10_000 });

/** embed asks for two vectors with the given encoding_format (undefined:
 * the SDK's default, which asks for base64 and decodes it). */
async function embed(encoding_format) {
  const res = await client.embeddings.create({ model: model(), input: ['the first text', 'the second text'], encoding_format });
  return {
    object: res.object,
    vectors: res.data.map((d) => ({ index: d.index, dims: d.embedding.length, finite: d.embedding.every(Number.isFinite) })),
    usage: res.usage,
  };
}

await attempt('embeddings', () => embed(undefined));
await attempt('embeddings-float', () => embed('float'));

// Shared by the SDK client scripts: loading the pinned SDKs, the command
// line, and the JSON lines the Go tests read.
import { createRequire } from 'node:module';
import path from 'node:path';

/**
 * sdk loads a package from the tree fetch-sdkclients.sh installed, named by
 * LLMGW_SDK_NODE_MODULES (its node_modules directory). The scripts live in
 * the source tree and the packages in .cache/, so they are loaded by path
 * rather than by a bare import.
 */
export function sdk(name) {
  const nm = process.env.LLMGW_SDK_NODE_MODULES;
  if (!nm) {
    console.error('LLMGW_SDK_NODE_MODULES is not set (run fetch-sdkclients.sh)');
    process.exit(2);
  }
  return createRequire(path.join(path.resolve(nm), 'sdkclients.cjs'))(name);
}

/** baseURL is the gateway's base URL, the script's first argument. */
export function baseURL() {
  const base = process.argv[2];
  if (!base) {
    console.error(`usage: node ${path.basename(process.argv[1])} <gateway base URL, e.g. http://127.0.0.1:8080> [model]`);
    process.exit(2);
  }
  return base.replace(/\/+$/, '');
}

/** model is the model to ask for, the script's second argument. */
export function model() {
  return process.argv[3] || 'sim-model';
}

/**
 * errorInfo describes an error an SDK threw: its class, the HTTP status and
 * the error body's types (`type` is error.error?.type, the SDK's parsed
 * body's top-level type; `innerType` the nested error object's).
 */
export function errorInfo(err) {
  return {
    class: err?.constructor?.name ?? typeof err,
    status: err?.status ?? 0,
    type: err?.error?.type ?? null,
    innerType: err?.error?.error?.type ?? null,
    message: String(err?.message ?? err).slice(0, 500),
  };
}

/** emit writes one result as a JSON line on stdout. */
export function emit(result) {
  process.stdout.write(JSON.stringify(result) + '\n');
}

/**
 * attempt runs fn and emits {step, ...meta, ok: true, ...its result}, or
 * {step, ...meta, ok: false, error, upstream} when it throws (upstream: the
 * error answer's X-LLM-Upstream header, if any): one failing step does not
 * hide the others. It returns fn's result, or null.
 */
export async function attempt(step, fn, meta = {}) {
  try {
    const out = await fn();
    emit({ step, ...meta, ok: true, ...out });
    return out;
  } catch (err) {
    emit({ step, ...meta, ok: false, error: errorInfo(err), upstream: err?.headers?.get?.('x-llm-upstream') ?? null });
    return null;
  }
}

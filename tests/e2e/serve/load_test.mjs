// Load, burst and disconnect traffic for `tandem serve`, with the official client.
//
//   node load_test.mjs load BASE MODEL CLIENTS REQUESTS MAX_TOKENS
//     CLIENTS concurrent streaming clients, REQUESTS each, one after another.
//     Every stream must end with [DONE], carry MAX_TOKENS tokens (ignore_eos)
//     and spell the same text as the same request without streaming.
//   node load_test.mjs burst BASE MODEL N
//     N requests at once (non-streaming); prints how many got 200 and 429.
//   node load_test.mjs disconnect BASE MODEL N
//     N streaming clients that hang up after a few chunks of a long answer.
// Prints one JSON line of results; exit code 1 when a check fails.
import { createRequire } from "node:module";

const require = createRequire(import.meta.url);
const OpenAI = require(process.env.OPENAI_MODULE).default ?? require(process.env.OPENAI_MODULE);
const [mode, baseURL, model, ...rest] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey: "none", maxRetries: 0, timeout: 300_000 });
const prompt = (i) => `Request ${i % 16}: tell me about the number ${i % 16}`;

async function load(clients, requests, maxTokens) {
  const reference = new Map();
  for (let i = 0; i < 16; i++) {
    const r = await client.completions.create({ model, prompt: prompt(i), max_tokens: maxTokens, temperature: 0, ignore_eos: true });
    reference.set(i, r.choices[0].text);
  }
  let errors = 0, mismatched = 0, short = 0, done = 0, tokens = 0;
  const ttft = [];
  const t0 = performance.now();
  await Promise.all(Array.from({ length: clients }, async (_, c) => {
    for (let k = 0; k < requests; k++) {
      const i = c * requests + k;
      try {
        const start = performance.now();
        let first = -1, text = "", usage = null;
        const stream = await client.completions.create({
          model, prompt: prompt(i), max_tokens: maxTokens, temperature: 0, ignore_eos: true,
          stream: true, stream_options: { include_usage: true } });
        for await (const ch of stream) {
          if (ch.usage) usage = ch.usage;
          for (const x of ch.choices) {
            if (x.text && first < 0) first = performance.now() - start;
            text += x.text;
          }
        }
        if (first >= 0) ttft.push(first);
        if (!usage || usage.completion_tokens !== maxTokens) short++;
        else tokens += usage.completion_tokens;
        if (text !== reference.get(i % 16)) mismatched++;
        done++;
      } catch (e) {
        errors++;
        if (errors < 5) console.error(`request ${i}: ${e.status ?? ""} ${e.message}`);
      }
    }
  }));
  const seconds = (performance.now() - t0) / 1000;
  ttft.sort((a, b) => a - b);
  const pct = (p) => ttft.length ? ttft[Math.min(ttft.length - 1, Math.floor(p * ttft.length))] : null;
  const res = { mode: "load", clients, requests, done, errors, mismatched, short, tokens, seconds,
                requests_per_s: done / seconds, ttft_p50_ms: pct(0.5), ttft_p99_ms: pct(0.99) };
  console.log(JSON.stringify(res));
  return errors === 0 && mismatched === 0 && short === 0 && done === clients * requests;
}

async function burst(n) {
  const statuses = await Promise.all(Array.from({ length: n }, async (_, i) => {
    try {
      await client.completions.create({ model, prompt: prompt(i), max_tokens: 64, temperature: 0, ignore_eos: true });
      return 200;
    } catch (e) {
      if (e.status === 429 && !e.headers?.get?.("retry-after")) return -429;  // 429 without Retry-After
      if (e.status !== 429) console.error(`burst request ${i}: ${e.status ?? ""} ${e.name} ${e.message} ${e.cause?.code ?? ""}`);
      return e.status ?? -1;
    }
  }));
  const count = (s) => statuses.filter((x) => x === s).length;
  const res = { mode: "burst", n, ok: count(200), rate_limited: count(429), other: n - count(200) - count(429) };
  console.log(JSON.stringify(res));
  return res.other === 0;
}

async function disconnect(n) {
  let dropped = 0;
  await Promise.all(Array.from({ length: n }, async (_, i) => {
    const controller = new AbortController();
    try {
      const stream = await client.completions.create({
        model, prompt: prompt(i), max_tokens: 4000, temperature: 0, ignore_eos: true, stream: true },
        { signal: controller.signal });
      let chunks = 0;
      for await (const _c of stream) {
        if (++chunks === 3) {
          controller.abort();
          break;
        }
      }
      dropped++;
    } catch (e) {
      if (e.name === "APIUserAbortError" || e.name === "AbortError") dropped++;
      else console.error(`client ${i}: ${e.message}`);
    }
  }));
  console.log(JSON.stringify({ mode: "disconnect", n, dropped }));
  return dropped === n;
}

let ok = false;
if (mode === "load") ok = await load(Number(rest[0]), Number(rest[1]), Number(rest[2]));
else if (mode === "burst") ok = await burst(Number(rest[0]));
else if (mode === "disconnect") ok = await disconnect(Number(rest[0]));
else console.error(`unknown mode ${mode}`);
process.exit(ok ? 0 : 1);

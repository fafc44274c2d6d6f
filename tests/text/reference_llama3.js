#!/usr/bin/env node
// reference_llama3.js: Llama 3's token ids of each document, by the npm
// package llama3-tokenizer-js@1.2.0 (its CommonJS bundle, data baked in),
// the reference of meshlm's Llama 3 tokenizer tests
// (tests/text/check_tokenize.py).
//
// usage: reference_llama3.js [--fixtures DIR] [--bos] [--eos] [--time] FILE...
//   prints one JSON array of ids per FILE, one a line, in the order given.
//   By default neither <|begin_of_text|> (128000) nor <|end_of_text|> (128001)
//   is added: encode(text, {bos: false, eos: false}). --bos / --eos add them
//   (the package's own default is both). Special tokens written in the text
//   (<|eot_id|>, ...) become their ids, as in Hugging Face's encode.
//   --fixtures DIR  where jobscripts/fetch-fixtures.sh unpacked the packages
//                   (default $MESHLM_FIXTURES, else ~/.cache/meshlm/fixtures)
//   --time          on stderr: bytes, seconds of encoding, MB/s.
// Each file is read as bytes and decoded as UTF-8 (no newline translation).
//
// The package gives a merge's priority as its rank plus the position in the
// piece divided by the length of the whole text: ties go left to right as
// long as a piece is shorter than the text it comes from, which holds for
// whole documents (a single word encoded alone could tie wrongly).
'use strict';
const fs = require('fs');
const os = require('os');
const path = require('path');

let fixtures = process.env.MESHLM_FIXTURES || path.join(os.homedir(), '.cache', 'meshlm', 'fixtures');
const options = { bos: false, eos: false };
let timeIt = false;
const files = [];
const argv = process.argv.slice(2);
for (let i = 0; i < argv.length; i++) {
  if (argv[i] === '--fixtures') fixtures = argv[++i];
  else if (argv[i] === '--bos') options.bos = true;
  else if (argv[i] === '--eos') options.eos = true;
  else if (argv[i] === '--time') timeIt = true;
  else files.push(argv[i]);
}
const bundle = path.join(fixtures, 'llama3-tokenizer-js', 'bundle', 'commonjs-llama3-tokenizer-with-baked-data.cjs');
if (!fs.existsSync(bundle)) {
  console.error(`reference_llama3.js: ${bundle} not found: run jobscripts/install-deps.sh --tests ` +
                '(or jobscripts/fetch-fixtures.sh)');
  process.exit(2);
}
const tokenizer = require(bundle).llama3Tokenizer;

const texts = files.map(f => fs.readFileSync(f).toString('utf8'));
const bytes = files.reduce((n, f) => n + fs.statSync(f).size, 0);
const t0 = process.hrtime.bigint();
const lines = texts.map(t => JSON.stringify(tokenizer.encode(t, options)));
const seconds = Number(process.hrtime.bigint() - t0) / 1e9;
process.stdout.write(lines.map(l => l + '\n').join(''));
if (timeIt) console.error(`reference_llama3.js: ${bytes} bytes in ${seconds.toFixed(3)} s, ${(bytes / seconds / 1e6).toFixed(3)} MB/s`);

// The tokens of each text, by a real BPE tokenizer (gpt-tokenizer's encodings): reads a JSON
// array of strings on stdin, prints a JSON array of counts. For benchmarks/promptsize.py
// --tokenizer; NODE_PATH must hold gpt-tokenizer (the benchmark installs it in a cache).
const encoding = process.argv[2] || "o200k_base";
const { encode } = require(`gpt-tokenizer/cjs/encoding/${encoding}`);
// The template's markers (<|im_start|>) are counted as text: no special token is refused.
const plain = { disallowedSpecial: new Set() };
let input = "";
process.stdin.on("data", (d) => { input += d; });
process.stdin.on("end", () => {
  const texts = JSON.parse(input);
  process.stdout.write(JSON.stringify(texts.map((t) => encode(t, plain).length)));
});

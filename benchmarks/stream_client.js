#!/usr/bin/env node
// The streaming load for the crossbar benchmark: K concurrent SSE streams, no dependencies.
//
//   node benchmarks/stream_client.js --url URL [--streams K] [--chunks N] [--interval MS]
//                                    [--ramp MS] [--duration S] [--timeout S] [--key KEY]
//
// URL is a chat completions URL, e.g. http://127.0.0.1:8089/v1/chat/completions (direct)
// or http://127.0.0.1:7777/bench/v1/chat/completions (through crossbar). All K streams are
// opened at once, each on its own connection; with --ramp, stream i is opened i * MS / K ms
// after the first (with MS the length of one stream, streams arrive one after another the
// way agents' requests do, and K are open together at the peak). With --duration, every
// stream that ends is replaced by a new one until S seconds have passed (the soak load).
// With --key, every request carries "Authorization: Bearer KEY" (a route with api_keys).
//
// Per stream it records the time to first chunk (from sending the request to the first
// SSE event) and, per chunk, the added delay: the receive time minus the send time the
// upstream stamped into the chunk ("t", ms on the monotonic clock shared by every process
// on the machine). One JSON object is printed on stdout at the end.

"use strict";

const http = require("http");

function parseArgs(argv) {
  const args = {
    streams: 1,
    chunks: 50,
    interval: 20,
    ramp: 0,
    duration: 0,
    timeout: 120,
    url: "",
    key: "",
  };
  for (let i = 2; i < argv.length; i += 2) {
    const key = argv[i].replace(/^--/, "");
    const value = argv[i + 1];
    if (!(key in args) || value === undefined) {
      process.stderr.write(`stream_client: unknown or incomplete option ${argv[i]}\n`);
      process.exit(2);
    }
    args[key] = key === "url" || key === "key" ? value : Number(value);
  }
  if (!args.url) {
    process.stderr.write("stream_client: --url is required\n");
    process.exit(2);
  }
  return args;
}

function nowMs() {
  return Number(process.hrtime.bigint()) / 1e6;
}

function percentile(sorted, p) {
  if (sorted.length === 0) return null;
  const rank = Math.min(sorted.length - 1, Math.max(0, Math.ceil((p / 100) * sorted.length) - 1));
  return Math.round(sorted[rank] * 1000) / 1000;
}

function summary(values) {
  const sorted = Float64Array.from(values).sort();
  return {
    n: sorted.length,
    p50: percentile(sorted, 50),
    p90: percentile(sorted, 90),
    p99: percentile(sorted, 99),
    max: percentile(sorted, 100),
  };
}

const args = parseArgs(process.argv);
const target = new URL(args.url);
const body = Buffer.from(
  JSON.stringify({
    model: "bench-model",
    stream: true,
    max_tokens: args.chunks,
    bench_interval_ms: args.interval,
    messages: [{ role: "user", content: "Write a long answer." }],
  }),
);
const agent = new http.Agent({ keepAlive: false, maxSockets: Infinity });
const headers = { "Content-Type": "application/json", "Content-Length": body.length };
if (args.key) headers.Authorization = `Bearer ${args.key}`;

const ttfc = [];
const delays = [];
const errors = {};
let started = 0;
let completed = 0;
let failed = 0;
let chunks = 0;
let open = 0;
let stopping = false;
const began = nowMs();

function noteError(what) {
  errors[what] = (errors[what] || 0) + 1;
}

function openStream() {
  started += 1;
  open += 1;
  const sent = nowMs();
  let first = true;
  let done = false;
  let finished = false;
  let tail = "";
  const end = (ok, why) => {
    if (finished) return;
    finished = true;
    open -= 1;
    if (ok) completed += 1;
    else {
      failed += 1;
      noteError(why);
    }
    if (!stopping && args.duration > 0 && nowMs() - began < args.duration * 1000) openStream();
    else if (open === 0) report();
  };
  const req = http.request(
    {
      agent,
      host: target.hostname,
      port: target.port,
      path: target.pathname + target.search,
      method: "POST",
      headers,
    },
    (res) => {
      if (res.statusCode !== 200) {
        res.resume();
        res.on("end", () => end(false, `HTTP ${res.statusCode}`));
        return;
      }
      res.setEncoding("latin1");
      res.on("data", (text) => {
        const now = nowMs();
        tail += text;
        let cut;
        while ((cut = tail.indexOf("\n\n")) !== -1) {
          const event = tail.slice(0, cut);
          tail = tail.slice(cut + 2);
          if (first) {
            first = false;
            ttfc.push(now - sent);
          }
          if (event === "data: [DONE]") {
            done = true;
            continue;
          }
          const at = event.lastIndexOf('"t":');
          if (at !== -1) {
            chunks += 1;
            delays.push(now - parseFloat(event.slice(at + 4)));
          }
        }
      });
      res.on("end", () => end(done, "ended without [DONE]"));
      res.on("error", (e) => end(false, e.code || e.message));
    },
  );
  req.on("error", (e) => end(false, e.code || e.message));
  req.end(body);
}

let reported = false;
function report() {
  if (reported) return;
  reported = true;
  clearTimeout(guard);
  const out = {
    url: args.url,
    streams: args.streams,
    chunks_per_stream: args.chunks,
    interval_ms: args.interval,
    ramp_ms: args.ramp,
    started,
    completed,
    failed,
    errors,
    chunks,
    seconds: Math.round(nowMs() - began) / 1000,
    ttfc_ms: summary(ttfc),
    chunk_delay_ms: summary(delays),
  };
  process.stdout.write(JSON.stringify(out) + "\n");
  agent.destroy();
  process.exit(0);
}

const guard = setTimeout(
  () => {
    stopping = true;
    failed += open;
    if (open) noteError("timeout");
    open = 0;
    report();
  },
  (args.timeout + args.duration) * 1000,
);

for (let i = 0; i < args.streams; i++) {
  if (args.ramp > 0) setTimeout(openStream, (i * args.ramp) / args.streams);
  else openStream();
}

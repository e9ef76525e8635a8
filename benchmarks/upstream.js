#!/usr/bin/env node
// A fake llama-server for the crossbar benchmark: fast enough never to be the bottleneck.
// No dependencies; Node's http module only.
//
//   node benchmarks/upstream.js PORT [HOST]
//
// GET  /health               {"status":"ok"}
// GET  /v1/models            a router-style list with one loaded model, "bench-model"
// POST /v1/chat/completions  a fixed chat.completion (about 340 bytes, with Content-Length);
//                            with "stream": true, an SSE stream of "max_tokens" chunks
//                            (default 50), one every "bench_interval_ms" ms (default 20;
//                            0 sends them all at once), then "data: [DONE]".
//                            Every chunk carries "t": its send time in ms on the
//                            machine's monotonic clock (process.hrtime), so a client on
//                            the same machine can compute each chunk's delay.
// GET  /_bench/stats         {"connections": accepted so far, "open": open now,
//                            "requests": ..., "streams": ...} (not proxied by crossbar)
//
// Keep-alive is on; idle connections are closed after 5 s, as llama-server does.

"use strict";

const http = require("http");

const port = Number(process.argv[2] || 8089);
const host = process.argv[3] || "127.0.0.1";

const HEALTH = Buffer.from('{"status":"ok"}');
const MODELS = Buffer.from(
  JSON.stringify({
    object: "list",
    data: [
      { id: "bench-model", object: "model", owned_by: "llamacpp", status: { value: "loaded" } },
    ],
  }),
);
const COMPLETION = Buffer.from(
  JSON.stringify({
    id: "chatcmpl-bench00000000",
    object: "chat.completion",
    created: 1760000000,
    model: "bench-model",
    system_fingerprint: "b6000-bench",
    choices: [
      {
        index: 0,
        message: { role: "assistant", content: "Hello! How can I help you today?" },
        finish_reason: "stop",
      },
    ],
    usage: { prompt_tokens: 12, completion_tokens: 13, total_tokens: 25 },
  }),
);
const CHUNK_HEAD =
  'data: {"id":"chatcmpl-bench","object":"chat.completion.chunk","created":1760000000,' +
  '"model":"bench-model","choices":[{"index":0,"delta":{"content":"tok"},' +
  '"finish_reason":null}],"i":';
const DONE = "data: [DONE]\n\n";
const NOT_FOUND = Buffer.from('{"error":"not found"}');

const stats = { connections: 0, open: 0, requests: 0, streams: 0 };

function nowMs() {
  return Number(process.hrtime.bigint()) / 1e6;
}

function send(res, status, body, type) {
  res.writeHead(status, { "Content-Type": type || "application/json", "Content-Length": body.length });
  res.end(body);
}

function stream(req, res, count, interval) {
  stats.streams += 1;
  res.writeHead(200, {
    "Content-Type": "text/event-stream",
    "Cache-Control": "no-cache",
  });
  let i = 0;
  let timer = null;
  const stop = () => {
    if (timer !== null) clearInterval(timer);
    timer = null;
  };
  const one = () => {
    if (i >= count) {
      stop();
      res.end(DONE);
      return false;
    }
    res.write(CHUNK_HEAD + i + ',"t":' + nowMs().toFixed(3) + "}\n\n");
    i += 1;
    return true;
  };
  res.on("close", stop);
  if (interval <= 0) {
    while (one()) {}
  } else {
    if (one()) timer = setInterval(one, interval);
  }
}

function completions(req, res, raw) {
  let doc = {};
  try {
    doc = JSON.parse(raw);
  } catch (e) {
    doc = {};
  }
  if (doc && doc.stream === true) {
    const count = Number.isInteger(doc.max_tokens) && doc.max_tokens >= 0 ? doc.max_tokens : 50;
    const interval = typeof doc.bench_interval_ms === "number" ? doc.bench_interval_ms : 20;
    stream(req, res, count, interval);
  } else {
    send(res, 200, COMPLETION);
  }
}

const server = http.createServer((req, res) => {
  stats.requests += 1;
  const path = req.url.split("?", 1)[0];
  if (req.method === "POST" && path === "/v1/chat/completions") {
    const parts = [];
    req.on("data", (d) => parts.push(d));
    req.on("end", () => completions(req, res, Buffer.concat(parts).toString()));
    return;
  }
  // Drain any body so the connection can be reused.
  req.resume();
  if (path === "/health") send(res, 200, HEALTH);
  else if (path === "/v1/models") send(res, 200, MODELS);
  else if (path === "/_bench/stats") send(res, 200, Buffer.from(JSON.stringify(stats)));
  else send(res, 404, NOT_FOUND);
});

server.keepAliveTimeout = 5000;
server.headersTimeout = 10000;
server.requestTimeout = 0;
server.maxRequestsPerSocket = 0;
server.on("connection", (socket) => {
  stats.connections += 1;
  stats.open += 1;
  socket.setNoDelay(true);
  socket.on("close", () => {
    stats.open -= 1;
  });
});
server.listen({ port, host, backlog: 4096 }, () => {
  process.stdout.write(`upstream listening on ${host}:${port}\n`);
});

-- wrk script for the crossbar benchmark: a small non-streaming chat completion POST,
-- and one JSON line with the results at the end (benchmarks/run.py reads it).
--
--   wrk -t2 -c64 -d5s -s benchmarks/post.lua http://127.0.0.1:7777/bench/v1/chat/completions

wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.body = '{"model":"bench-model","messages":[{"role":"user","content":"Say hello."}],'
  .. '"max_tokens":16}'

function done(summary, latency, requests)
  local errors = summary.errors
  io.write(string.format(
    'WRK_JSON {"requests":%d,"duration_us":%d,"bytes":%d,'
      .. '"errors":{"connect":%d,"read":%d,"write":%d,"status":%d,"timeout":%d},'
      .. '"latency_us":{"mean":%.1f,"p50":%d,"p90":%d,"p99":%d,"max":%d}}\n',
    summary.requests, summary.duration, summary.bytes,
    errors.connect, errors.read, errors.write, errors.status, errors.timeout,
    latency.mean, latency:percentile(50), latency:percentile(90), latency:percentile(99),
    latency.max))
end

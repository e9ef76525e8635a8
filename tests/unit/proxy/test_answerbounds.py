"""crossbar.proxy.answerbounds: a host's usage numbers past what its request could take (its
window, its answer limit) are not charged to the key, and crossbar says so in one line."""

from __future__ import annotations

import json

from crossbar.config import parse_config
from crossbar.testing import LogCapture, MemoryProxy


def test_a_host_s_implausible_usage_is_dropped_and_said() -> None:
    config = parse_config(
        {
            "hosts": {"gpu-a": "http://127.0.0.1:18081"},
            "routes": {"lab": {"hosts": ["gpu-a"], "default_model": "m"}},
        }
    )
    memory = MemoryProxy(config, models=("m",))
    memory.table.record_window("gpu-a", "m", 4096)
    body = json.dumps({"max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]})
    client = memory.client()
    client.send(
        b"POST /lab/v1/chat/completions HTTP/1.1\r\nHost: c\r\nContent-Length: %d\r\n\r\n%s"
        % (len(body), body.encode())
    )
    usage = {"prompt_tokens": 10**9, "completion_tokens": 10**9, "total_tokens": 2 * 10**9}
    answer = json.dumps({"choices": [{"message": {"content": "ok"}}], "usage": usage}).encode()
    logs = LogCapture()
    try:
        memory.accept().send(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
            % (len(answer), answer)
        )
    finally:
        logs.close()

    record = memory.records[-1]
    assert record.status == 200
    assert (record.prompt_tokens, record.generated_tokens) == (None, None)
    assert logs.matching(
        "host gpu-a, model m: usage dropped as implausible: prompt_tokens 1,000,000,000"
        " over 4,096 (the host's window); completion_tokens 1,000,000,000 over 74"
        " (max_tokens 10 and a margin)"
    )

"""A real llama-server's refusal of a prompt longer than its slot, as it answers it."""

from __future__ import annotations

REAL = (
    b'{"error":{"code":400,"message":"request (3528 tokens) exceeds the available context size'
    b' (2048 tokens), try increasing it","type":"exceed_context_size_error",'
    b'"n_prompt_tokens":3528,"n_ctx":2048}}'
)
"""llama.cpp 0c1e57098's answer, byte for byte, to a 3,528-token prompt on a 2,048-token slot."""

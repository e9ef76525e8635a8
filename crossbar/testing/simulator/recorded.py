"""What a simulated host records of each request, and the faults it can be told to make."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

Fault = Literal["loading", "error", "hang", "reset", "close", "die_in_prefill"] | None
"""What a host can be told to do wrong with every request from now on (``None``: nothing).

``loading`` answers 503 as a starting server does, ``error`` answers ``error_status``,
``hang`` never answers, ``close`` closes the connection unanswered, ``reset`` aborts it
(a stream after ``reset_after`` tokens), ``die_in_prefill`` sends a stream's head and a
``:`` ping as llama-server does when a slot takes the request, then aborts the connection
(a host killed while it reads a long prompt; any other answer is aborted unanswered).
"""


@dataclass(frozen=True)
class RecordedRequest:
    """One request as the simulated host received it."""

    method: str
    path: str  # including the query string
    headers: dict[str, str]  # lower-cased names
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)

"""The child process that reads one long model list for the poller
(:mod:`crossbar.polling.listreader`): the answer's bytes on standard input, what crossbar
keeps of them on standard output, as JSON. No Twisted: it reads, decodes and exits.

Its output is ``{"models": ...}``, a :class:`~crossbar.polling.modellist.ModelList` (at
most ``MAX_MODELS`` ids of at most ``MAX_ID_BYTES`` bytes each: a few hundred KiB at
most), or ``{"error": "..."}`` when the answer is not a model list.
"""

from __future__ import annotations

import sys

import msgspec

from crossbar.polling.modellist import read_models


def answer(body: bytes) -> bytes:
    """What the parent is told of ``body``."""
    try:
        return msgspec.json.encode({"models": read_models(body)})
    except ValueError as e:
        return msgspec.json.encode({"error": str(e)})


def main() -> None:
    sys.stdout.buffer.write(answer(sys.stdin.buffer.read()))
    sys.stdout.buffer.flush()


if __name__ == "__main__":
    main()

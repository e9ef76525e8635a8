"""``python -m crossbar.clients``: print an agent's settings for a route of a running crossbar.

    python -m crossbar.clients --url http://crossbar:7777 --route opencode --agent codex

It reads ``/_crossbar/status`` (with ``--status-key-env``'s key, when the config has
``status_keys``), and prints, ready to paste, the agent's settings with the smallest slot
window the route's hosts told crossbar for the model (``--model``, else the route's
default). The route's key is referred to by the variable ``--key-env`` names, never written.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.error
import urllib.request
from collections.abc import Sequence
from typing import Any

from crossbar.clients.settings import AGENTS, NoWindow, render, route_windows

TIMEOUT = 10.0
MAX_STATUS = 16 * 1024 * 1024


def read_status(url: str, key: str | None) -> dict[str, Any]:
    """The status JSON of the crossbar at ``url``; ``SystemExit`` with words on failure."""
    request = urllib.request.Request(url.rstrip("/") + "/_crossbar/status")
    request.add_header("Accept", "application/json")
    if key:
        request.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT) as answer:
            doc = json.loads(answer.read(MAX_STATUS))
    except urllib.error.HTTPError as e:
        hint = " (set the status key's variable: --status-key-env)" if e.code == 401 else ""
        raise SystemExit(f"crossbar at {url} answered {e.code} for its status{hint}") from None
    except (urllib.error.URLError, OSError, ValueError) as e:
        raise SystemExit(f"could not read crossbar's status at {url}: {e}") from None
    if not isinstance(doc, dict):
        raise SystemExit(f"crossbar at {url} answered no status document")
    return doc


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m crossbar.clients", description=__doc__)
    parser.add_argument("--url", default="http://127.0.0.1:7777", help="crossbar's address")
    parser.add_argument("--route", required=True)
    parser.add_argument("--agent", required=True, choices=sorted(AGENTS))
    parser.add_argument("--model", help="the model (default: the route's default model)")
    parser.add_argument(
        "--key-env", default="CROSSBAR_KEY", help="variable the agent reads the route's key from"
    )
    parser.add_argument(
        "--status-key-env", help="variable holding a status key, for a crossbar with status_keys"
    )
    args = parser.parse_args(argv)
    key = os.environ.get(args.status_key_env) if args.status_key_env else None
    status = read_status(args.url, key)
    try:
        found = route_windows(status, args.route, args.model)
    except NoWindow as e:
        raise SystemExit(str(e)) from None
    sys.stdout.write(render(args.agent, found, args.key_env))


if __name__ == "__main__":
    main()

"""crossbar.pages.prefixtable: the shared prefixes seen lately and each host's saved ones,
as the status page shows them; the same data as the status JSON's ``prefixes``."""

from __future__ import annotations

from typing import Any

from twisted.web.template import flattenString, tags

from crossbar.pages.prefixtable import prefixes_section
from crossbar.prefixes import PrefixCounts, PrefixSaves


def flatten(shared: list[dict[str, Any]], hosts: list[dict[str, Any]]) -> str:
    done: list[object] = []
    flattenString(None, prefixes_section(shared, hosts, tags.div())).addBoth(done.append)
    assert len(done) == 1 and isinstance(done[0], bytes), done
    return done[0].decode()


def test_none_seen_says_so() -> None:
    assert "No new conversation of a cache_affinity route began lately." in flatten([], [])


def test_prefixes_and_what_each_host_holds_in_words() -> None:
    counts, saves = PrefixCounts(), PrefixSaves(lambda host: 8)
    for at in range(3):
        counts.saw("lab", "tiny-a", b"\x01\x02\x03\x04\x05\x06", float(at))
    saves.saved(
        "gpu-a", ("tiny-a", "b1 m", b"\x01\x02\x03\x04\x05\x06"), "crossbar-prefix-0.bin", 4607
    )
    saves.refused("gpu-b", 0.0)
    page = flatten(counts.listing(12.0), saves.listing())
    assert "<code>010203040506</code>" in page and ">3</td>" in page and ">10 s ago</td>" in page
    assert "gpu-a: 010203040506 (tiny-a, 4607 tokens); restored 0 times" in page
    assert "gpu-b: keeps no saved slots (started without --slot-save-path)" in page

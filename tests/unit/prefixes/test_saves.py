"""crossbar.prefixes.saves: what each host holds saved, its files bounded, and its back-off."""

from __future__ import annotations

from crossbar.prefixes.saves import BACK_OFF, REFUSED_AGAIN, PrefixSaves


def test_a_host_without_saves_is_not_asked_again_for_long() -> None:
    saves = PrefixSaves(lambda host: 8)
    assert saves.may_ask("a", 0.0) and saves.allows("a") is None
    saves.refused("a", 0.0)
    assert saves.allows("a") is False
    assert not saves.may_ask("a", REFUSED_AGAIN - 1)
    assert saves.may_ask("a", REFUSED_AGAIN) and saves.may_ask("b", 0.0)


def test_failures_back_off_doubling_and_a_success_ends_it() -> None:
    saves = PrefixSaves(lambda host: 8)
    assert saves.failed("a", 0.0) == BACK_OFF
    assert saves.failed("a", 0.0) == 2 * BACK_OFF
    assert not saves.may_ask("a", 2 * BACK_OFF - 1)
    saves.saved("a", ("m", "b1", b"p"), "crossbar-prefix-0.bin", 500)
    assert saves.may_ask("a", 0.0) and saves.allows("a") is True
    assert saves.failed("a", 0.0) == BACK_OFF


def test_file_names_are_crossbars_own_and_bounded_by_the_count() -> None:
    saves = PrefixSaves(lambda host: 2)
    keys = [("m", "b1", p) for p in (b"client text", b"two", b"three")]
    for key in keys[:2]:
        saves.saved("a", key, saves.name_for("a", key), 100)
    saves.find("a", keys[0])  # used: the other is the least recently used
    name = saves.name_for("a", keys[2])
    assert name == "crossbar-prefix-1.bin"
    saves.saved("a", keys[2], name, 100)
    assert saves.find("a", keys[1]) is None
    assert {saves.find("a", k).name for k in (keys[0], keys[2])} == {  # type: ignore[union-attr]
        "crossbar-prefix-0.bin",
        "crossbar-prefix-1.bin",
    }


def test_a_prefix_belongs_to_its_model_and_build_and_a_reload_forgets_it() -> None:
    saves = PrefixSaves(lambda host: 8)
    saves.saved("a", ("m", "b1", b"p"), "crossbar-prefix-0.bin", 100)
    assert saves.find("a", ("m", "b2", b"p")) is None  # another build: saved again
    saves.forget("a", "m")
    assert saves.find("a", ("m", "b1", b"p")) is None
    saves.restored("a")
    assert saves.listing() == [{"host": "a", "allows_saves": True, "restores": 1, "saved": []}]

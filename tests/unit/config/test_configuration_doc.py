"""``docs/configuration.md`` against the loader: every key crossbar.yaml accepts is
documented, every documented key is accepted, each default in backticks is the one the
loader fills in, and each documented bad value gets the documented answer. The keys come
from the loader itself (the list its "unknown key" error gives) and from the attrs fields
of the config model, never from a list copied here; so a key added without its line in
the document fails here. Also: every relative link in the README and the docs resolves.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import attrs
import pytest
import yaml

from crossbar.config import (
    Config,
    ConfigError,
    HostSettings,
    KeyHolder,
    Limits,
    RouteConfig,
    parse_config,
)

REPO = Path(__file__).resolve().parents[3]
DOC = REPO / "docs" / "configuration.md"

SECTIONS = {
    "Top level": "top",
    "Per-host settings": "settings",
    "Hosts": "host",
    "Routes": "route",
    "Named keys": "holder",
}
"""The document's tables by heading, and where in crossbar.yaml each one's keys go."""

ROW = re.compile(r"^\| `(\w+)` \| (.*?) \| (.*) \| (.*) \|$")
BAD = re.compile(r"^`([^`]*)` → `([^`]*)`")
LITERAL = re.compile(r"^`([^`]*)`$")
URL = "http://127.0.0.1:8080"


@attrs.frozen
class Row:
    section: str
    key: str
    default: str
    bad: str


def rows() -> list[Row]:
    """Every row of the document's key tables, with the section it is under."""
    found, section = [], None
    for line in DOC.read_text().splitlines():
        if line.startswith("## "):
            section = SECTIONS.get(line[3:].strip())
        match = ROW.match(line)
        if section and match:
            found.append(Row(section, match.group(1), match.group(2), match.group(4)))
    return found


def documented(section: str) -> set[str]:
    return {row.key for row in rows() if row.section == section}


def base() -> dict[str, Any]:
    return {"hosts": {"gpu-a": URL}, "routes": {"lab": {"hosts": ["gpu-a"]}}}


def place(section: str, key: str, value: object) -> dict[str, Any]:
    """A minimal config with ``key: value`` where the section's keys go."""
    data = base()
    if section in ("top", "settings"):
        data[key] = value
    elif section == "host":
        data["hosts"]["gpu-a"] = {"url": URL, key: value}
    elif section == "route":
        data["routes"]["lab"][key] = value
    else:
        data["api_keys"] = [{"name": "alice", "key": "k-alice-0001", key: value}]
    return data


def accepted(section: str) -> set[str]:
    """The keys the loader accepts there, read from its answer to one it does not."""
    with pytest.raises(ConfigError) as caught:
        parse_config(place(section, "no_such_key", 1))
    listed = re.fullmatch(r"unknown key \(expected one of: (.*)\)", caught.value.problem)
    assert listed, caught.value.problem
    return set(listed.group(1).split(", "))


def load(data: dict[str, Any], base_dir: Path) -> tuple[Config, list[KeyHolder | None]]:
    config = parse_config(data, base=base_dir)
    holders = [key.holder for key in config.routes["lab"].api_keys]
    return config, holders


def with_affinity(data: dict[str, Any]) -> dict[str, Any]:
    data = copy.deepcopy(data)
    data["routes"]["lab"]["policy"] = "cache_affinity"
    return data


def test_every_key_the_loader_accepts_is_documented_and_no_other() -> None:
    assert documented("top") | documented("settings") == accepted("top")
    assert documented("host") | documented("settings") == accepted("host")
    assert documented("route") == accepted("route")
    assert documented("holder") == accepted("holder")


def test_every_field_of_the_config_model_is_documented() -> None:
    fields = {
        "settings": set(attrs.fields_dict(HostSettings)),
        "top": set(attrs.fields_dict(Limits)),
        "route": set(attrs.fields_dict(RouteConfig)) - {"name"},
        "holder": set(attrs.fields_dict(KeyHolder)),
    }
    for section, names in fields.items():
        assert names <= documented(section), f"{section}: {names - documented(section)}"


def test_the_tables_are_read() -> None:
    """The parse above would pass on an empty document: it must find every table."""
    assert {row.section for row in rows()} == set(SECTIONS.values())
    assert len(rows()) >= 50


@pytest.mark.parametrize("row", rows(), ids=lambda row: f"{row.section}.{row.key}")
def test_each_stated_default_is_the_loader_s(
    row: Row, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Writing the documented default gives the config that leaving the key out gives."""
    monkeypatch.delenv("STATE_DIRECTORY", raising=False)
    literal = LITERAL.match(row.default)
    if literal is None:
        assert row.default, f"{row.key} states no default"
        assert "`" not in row.default, f"{row.key}: a default is one value in backticks"
        return
    sections = ["top", "settings"] if row.section == "settings" else [row.section]
    if row.section == "settings":
        sections.append("host")
    for section in sections:
        written, left_out = place(section, row.key, yaml.safe_load(literal.group(1))), base()
        if section == "holder":
            left_out = place("holder", "priority", "normal")
            del left_out["api_keys"][0]["priority"]
        try:
            expected = load(left_out, tmp_path)
            got = load(written, tmp_path)
        except ConfigError as e:
            assert e.problem == "is only for policy cache_affinity", str(e)
            expected = load(with_affinity(left_out), tmp_path)
            got = load(with_affinity(written), tmp_path)
        assert got == expected, f"{section}.{row.key}: {row.default} is not the default"


@pytest.mark.parametrize("row", rows(), ids=lambda row: f"{row.section}.{row.key}")
def test_each_bad_value_gets_the_documented_answer(row: Row, tmp_path: Path) -> None:
    bad = BAD.match(row.bad)
    assert bad, f"{row.key}: no bad value documented as `value` → `answer`"
    value, answer = yaml.safe_load(bad.group(1)), bad.group(2)
    data = place(row.section, row.key, value)
    if row.key in ("affinity_max_load", "home_wait"):
        data = with_affinity(data)
    with pytest.raises(ConfigError) as caught:
        parse_config(data, base=tmp_path)
    assert caught.value.problem == answer
    assert row.key in caught.value.key


# -- links ---------------------------------------------------------------------------------------

LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")


def pages() -> list[Path]:
    found = [REPO / "README.md", REPO / "SECURITY.md", REPO / "CHANGELOG.md"]
    return [page for page in found if page.exists()] + sorted((REPO / "docs").rglob("*.md"))


def anchors(page: Path) -> set[str]:
    """GitHub's anchors for a page's headings: lower case, punctuation dropped, spaces -."""
    found = set()
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    for heading in re.findall(r"^#+ (.*)$", text, re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        found.add(slug)
    return found


@pytest.mark.parametrize("page", pages(), ids=lambda page: str(page.relative_to(REPO)))
def test_every_relative_link_resolves(page: Path) -> None:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        assert linked.exists(), f"{page.name}: {target} does not exist"
        if anchor and linked.suffix == ".md":
            assert anchor in anchors(linked), f"{page.name}: {target} has no such heading"


PATH_NAMED = re.compile(r"`((?:crossbar|tests|benchmarks|contrib|scripts|docs)/[\w./-]*\w)`")
SOURCE_NAMED = re.compile(r"`([\w/]+/\w+\.py)`")
"""A module named by its path within the package (``routing/policies.py``)."""
MODULE_NAMED = re.compile(r"`(crossbar(?:\.\w+)+)`")
NOT_MODULES = {"crossbar.yaml", "crossbar.service", "crossbar.env", "crossbar.access"}
"""Named like modules: the config, the systemd unit, its environment, the access log's namespace."""


def module_exists(dotted: str) -> bool:
    """A module or package of the tree, or a name defined in one (``crossbar.x.Name``)."""
    parts = dotted.split(".")
    for end in (len(parts), len(parts) - 1) if len(parts) > 2 else (len(parts),):
        base = REPO.joinpath(*parts[:end])
        if base.with_suffix(".py").exists() or (base / "__init__.py").exists():
            return True
    return False


@pytest.mark.parametrize("page", pages(), ids=lambda page: str(page.relative_to(REPO)))
def test_every_file_and_module_named_exists(page: Path) -> None:
    """The docs name the files and modules of this tree, not of an older layout."""
    text = page.read_text()
    for path in PATH_NAMED.findall(text):
        assert (REPO / path).exists(), f"{page.name} names {path}, which does not exist"
    for path in SOURCE_NAMED.findall(text):
        found = (REPO / path).exists() or (REPO / "crossbar" / path).exists()
        assert found, f"{page.name} names {path}, which does not exist"
    for dotted in set(MODULE_NAMED.findall(text)) - NOT_MODULES:
        assert module_exists(dotted), f"{page.name} names {dotted}, which does not exist"

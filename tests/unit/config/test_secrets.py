"""Keys from the config: read from the environment when asked, never shown."""

from __future__ import annotations

import pytest

from crossbar.config import Secret, mask_url, matching
from crossbar.config.secrets import expand, shown_url


def test_a_literal_key_is_kept_as_bytes_and_never_shown() -> None:
    key = expand("s3cret-Key_1")
    assert key.value == b"s3cret-Key_1"
    for shown in (repr(key), str(key), f"{key}", repr([key]), repr((key,))):
        assert "s3cret" not in shown
        assert "****" in shown


def test_a_variable_is_read_from_the_environment_and_named_not_shown() -> None:
    key = expand("${LAB_KEY}", {"LAB_KEY": "from-env-123"})
    assert key.value == b"from-env-123"
    assert key.source == "${LAB_KEY}"
    assert "from-env" not in repr(key)


def test_variables_may_be_part_of_a_key() -> None:
    key = expand("pre-${A}-${B}", {"A": "x", "B": "y"})
    assert key.value == b"pre-x-y"
    assert key.source == "${A}, ${B}"


def test_a_missing_variable_names_the_variable() -> None:
    with pytest.raises(ValueError, match=r"^environment variable LAB_KEY is not set$"):
        expand("${LAB_KEY}", {})


@pytest.mark.parametrize(
    ("text", "environ", "problem"),
    [
        ("", {}, "is empty (literal)"),
        ("${EMPTY}", {"EMPTY": ""}, "is empty (${EMPTY})"),
        (
            "two words",
            {},
            "must be printable ASCII without spaces (literal; the value is not shown)",
        ),
        (
            "${K}",
            {"K": "new\nline"},
            "must be printable ASCII without spaces (${K}; the value is not shown)",
        ),
        ("clé", {}, "must be printable ASCII without spaces (literal; the value is not shown)"),
        ("${1BAD}", {}, "${1BAD} is not an environment variable name"),
    ],
)
def test_keys_that_cannot_be_sent_are_refused_without_their_value(
    text: str, environ: dict[str, str], problem: str
) -> None:
    with pytest.raises(ValueError) as info:
        expand(text, environ)
    assert str(info.value) == problem
    for value in environ.values():
        if value:
            assert value not in str(info.value)


def test_matching_finds_which_of_the_keys_and_nothing_else() -> None:
    keys = (Secret(b"alpha"), Secret(b"beta"))
    assert matching(b"alpha", keys) is keys[0]
    assert matching(b"beta", keys) is keys[1]
    assert matching(b"alph", keys) is None
    assert matching(b"alphaa", keys) is None
    assert matching(b"", keys) is None
    assert matching(b"alpha", ()) is None


def test_equal_keys_compare_equal_whatever_their_source() -> None:
    assert Secret(b"k", "${A}") == Secret(b"k", "literal")


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("http://user:pass@host:8080/x", "http://user:****@host:8080/x"),
        ("https://:p%40ss@10.0.0.1", "https://:****@10.0.0.1"),
        ("http://host:8080", "http://host:8080"),
        ("http://user@host", "http://user@host"),
        ("see http://a:b@h and http://c:d@i", "see http://a:****@h and http://c:****@i"),
        ("'https://u:p/s?s#s@h:1/x' (cannot)", "'https://u:****@h:1/x' (cannot)"),
        ("https://u:p@ss@h", "https://u:****@h"),
    ],
)
def test_urls_are_shown_with_their_password_masked(url: str, shown: str) -> None:
    assert mask_url(url) == shown


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("https://u:p/s s'\"@h:1/x", "https://u:****@h:1/x"),
        ("https://token@h", "https://****@h"),
        ("https://u/x:p@h", "https://u/x:****@h"),
        ("http://h:8080/v1", "http://h:8080/v1"),
        ("no-url@all", "no-url@all"),
    ],
)
def test_one_url_is_quoted_with_all_before_its_last_at_masked(url: str, shown: str) -> None:
    """A URL quoted whole (in a config error) hides whatever its password holds."""
    assert shown_url(url) == shown

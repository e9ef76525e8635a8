"""crossbar.yaml checks: the minimal form works, and every mistake names file, key and problem."""

from __future__ import annotations

import tempfile
import textwrap
from pathlib import Path

import attrs
import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from crossbar.config import (
    ConfigError,
    HostSettings,
    Limits,
    effective,
    load_config,
    parse_config,
    parse_duration,
)
from crossbar.config.load import _TOP_KEYS
from crossbar.config.model import HOME_WAIT
from tests.support.certs import self_signed_ca
from tests.support.configfiles import MINIMAL, error_of, write


def test_minimal_form_is_accepted(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, MINIMAL))
    assert config.listen == "tcp:7777:backlog=1024"  # all interfaces, room for bursts
    assert config.defaults.poll_interval == 5.0
    assert config.settings["gpu-a"] == HostSettings()  # every default as documented
    assert config.hosts["gpu-a"].url == "http://10.0.0.11:8080"
    assert config.hosts["gpu-b"].url == "http://10.0.0.12:8080"  # trailing slash trimmed
    route = config.routes["opencode-a"]
    assert route.hosts == ("gpu-a", "gpu-b")
    assert route.default_model == "qwen3-coder-30b"


def test_example_config_in_repo_is_valid() -> None:
    example = Path(__file__).parents[3] / "crossbar.yaml"
    config = load_config(example)
    assert config.hosts["gpu-c"].url == "http://10.0.0.13:8080/llama"  # path prefix kept
    assert {r.list_models for r in config.routes.values()} == {"merged"}
    minimal = parse_config(yaml.safe_load(MINIMAL))
    assert {r.list_models for r in minimal.routes.values()} == {"forwarded"}  # the default


def test_endpoint_string_listen(tmp_path: Path) -> None:
    text = MINIMAL.replace("listen: 7777 ", 'listen: "tcp:7777:interface=127.0.0.1"')
    listen = load_config(write(tmp_path, text)).listen
    assert listen == "tcp:7777:interface=127.0.0.1:backlog=1024"  # Twisted's 50 drops bursts


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("250ms", 0.25), ("5s", 5.0), ("2m", 120.0), ("1h", 3600.0), (3, 3.0), (0.5, 0.5)],
)
def test_durations(text: object, seconds: float) -> None:
    assert parse_duration(text) == seconds


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError, match=r"nope\.yaml: no such file"):
        load_config(path)


def test_yaml_syntax_error_names_line(tmp_path: Path) -> None:
    message = error_of(tmp_path, "listen: 7777\nhosts: [a, b\nroutes: {}\n")
    assert message.startswith("YAML syntax error: line ")


UNCLOSED = "hosts: {gpu-a: 'http://h'}\nroutes: [oops"


def test_a_yaml_error_on_the_last_line_is_one_line(tmp_path: Path) -> None:
    """Audit finding 8: an unclosed ``[`` on the last line, the file ending in a newline,
    was an IndexError and a traceback."""
    problem = "expected ',' or ']', but got '<stream end>'"
    assert error_of(tmp_path, UNCLOSED) == f"YAML syntax error: line 2: {problem}"
    assert error_of(tmp_path, UNCLOSED + "\n\n") == (
        f"YAML syntax error: at the end of the file: {problem}"
        " (while parsing a flow sequence begun on line 2)"
    )


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('"a\\nb": 1\n', "a\\nb: unknown key"),
        ('hosts: {"a\\u2028b": x}\nroutes: {}\n', "hosts.a\\u2028b: name 'a\\u2028b' must match"),
        ("a: 2024-13-01\n", "YAML value that cannot be read: month must be in 1..12"),
        ("a: !!timestamp x\n", "YAML value that cannot be read: a tagged value of the wrong"),
        ("a: 1" + "0" * 4300 + "\n", "YAML value that cannot be read: a number of more than"),
        ("a: " + "[" * 5000 + "\n", "YAML nested too deeply to read"),
        (MINIMAL + "idle_timeout: 1" + "0" * 400 + "\n", "idle_timeout: is too long"),
    ],
)
def test_what_yaml_reads_badly_is_one_line(tmp_path: Path, text: str, message: str) -> None:
    """A key with a line break in it, values PyYAML's constructors fail on and a number of
    seconds too large for a float: each was a traceback or an error of two lines."""
    assert error_of(tmp_path, text).startswith(message)


MISTAKES = [
    (("poll_interval: 5s", "poll_interval: 5s\nretries: 3"), "retries", "unknown key"),
    (
        ("    default_model", "    colour: red\n    default_model"),
        "routes.opencode-a.colour",
        "unknown key",
    ),
    (("[gpu-a, gpu-b]", "[gpu-a, gpu-z]"), "routes.opencode-a.hosts", "unknown host 'gpu-z'"),
    (("[gpu-a, gpu-b]", "[]"), "routes.opencode-a.hosts", "non-empty list"),
    (("http://10.0.0.11:8080", "ftp://10.0.0.11"), "hosts.gpu-a", "http(s)://"),
    (("http://10.0.0.11:8080", "http://10.0.0.11:8080/x?y=1"), "hosts.gpu-a", "no query"),
    (
        ("http://10.0.0.11:8080", "http://10.0.0.11:8080/#top"),
        "hosts.gpu-a",
        "no query or fragment",
    ),
    (("http://10.0.0.11:8080", "http://10.0.0.11:99999"), "hosts.gpu-a", "valid URL"),
    (("http://10.0.0.11:8080", "10.0.0.11:8080"), "hosts.gpu-a", "http(s)://"),
    (("poll_interval: 5s", "poll_interval: 5 parsecs"), "poll_interval", "not a duration"),
    (("poll_interval: 5s", "poll_interval: 0s"), "poll_interval", "more than zero"),
    (("poll_interval: 5s", "poll_interval: -2"), "poll_interval", "more than zero"),
    (("listen: 7777 ", "listen: 70000 "), "listen", "1-65535"),
    (("listen: 7777 ", "listen: 0 "), "listen", "1-65535"),
    (("listen: 7777 ", 'listen: "bogus:thing" '), "listen", "unknown endpoint type"),
    (("listen: 7777 ", 'listen: "tcp:7777:colour=red" '), "listen", "unknown option 'colour'"),
    (("listen: 7777 ", 'listen: "tcp:seven" '), "listen", "a port must be a number"),
    (
        ("listen: 7777 ", "listen: 7777\nlisten_reuse_port: yes please"),
        "listen_reuse_port",
        "must be true or false",
    ),
    (
        ("listen: 7777 ", 'listen: 7777\nlisten_reuse_port: "true"'),
        "listen_reuse_port",
        "must be true or false",
    ),
    (
        ("listen: 7777 ", 'listen: "unix:/tmp/crossbar.sock"\nlisten_reuse_port: true\n#'),
        "listen",
        "tcp",
    ),
    (("  gpu-b: http", "  gpu-a: http"), "hosts.gpu-a", "duplicate key"),
    (
        ("poll_interval: 5s", "poll_interval: 5s\npoll_interval: 9s"),
        "poll_interval",
        "duplicate",
    ),
    (
        (
            "    default_model",
            "    policy: priority\n    policy: least_busy\n    default_model",
        ),
        "routes.opencode-a.policy",
        "duplicate key",
    ),
    (("  gpu-b: http", "  gpu b: http"), "hosts.gpu b", "must match [A-Za-z0-9._-]+"),
    (("  opencode-a:", "  open/code:"), "routes.open/code", "must match [A-Za-z0-9._-]+"),
    (("  opencode-a:", "  _crossbar:"), "routes._crossbar", "reserved"),
    (("  opencode-a:", "  v1:"), "routes.v1", "a route named v1 would read as the API's /v1"),
    (
        ("    default_model", "    policy: fastest\n    default_model"),
        "routes.opencode-a.policy",
        "must be one of priority, round_robin, least_busy, cache_affinity",
    ),
    (
        ("    default_model", "    when_all_down: panic\n    default_model"),
        "routes.opencode-a.when_all_down",
        "must be one of fail, try_all",
    ),
    (
        ("    default_model", "    list_models: all\n    default_model"),
        "routes.opencode-a.list_models",
        "must be one of forwarded, merged",
    ),
    (("poll_interval: 5s", "poll_interval: 5s\nmax_fails: 0"), "max_fails", "at least 1"),
    (("poll_interval: 5s", "poll_interval: 5s\nmodels_max: 0"), "models_max", "at least 1"),
    (
        ("poll_interval: 5s", "poll_interval: 5s\nhealth_path: /slots"),
        "health_path",
        "load a model",
    ),
]


def test_missing_sections(tmp_path: Path) -> None:
    assert error_of(tmp_path, "listen: 7777\n").startswith("hosts: is missing")
    assert error_of(tmp_path, "") == "is empty"


# -- keys, limits and TLS ---------------------------------------------------------------------


SECURED = (
    MINIMAL
    + """\
  open:
    hosts: [gpu-b]
    api_keys: []
  own:
    hosts: [gpu-a]
    api_keys: ["${ROUTE_KEY}"]
api_keys: ["${LAB_KEY}", literal-key]
status_keys: ["${STATUS_KEY}"]
status_listen: "tcp:9101:interface=127.0.0.1"
trusted_proxies: [10.0.0.0/8, "::1"]
body_timeout: 30s
max_connections: 100
max_body: 1MiB
max_body_memory: 64MiB
"""
)


ENVIRON = {"LAB_KEY": "lab-secret-1", "ROUTE_KEY": "route-secret-2", "STATUS_KEY": "status-3"}


def test_keys_limits_and_proxies_are_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in ENVIRON.items():
        monkeypatch.setenv(name, value)
    config = load_config(write(tmp_path, SECURED))
    routes = config.routes
    assert [k.value for k in routes["opencode-a"].api_keys] == [b"lab-secret-1", b"literal-key"]
    assert routes["open"].api_keys == ()  # an empty list opens a route
    assert [k.value for k in routes["own"].api_keys] == [b"route-secret-2"]  # replaces
    assert [k.value for k in config.status_keys] == [b"status-3"]
    assert config.status_listen == "tcp:9101:interface=127.0.0.1:backlog=1024"
    assert [str(n) for n in config.trusted_proxies] == ["10.0.0.0/8", "::1/128"]
    assert config.limits == Limits(
        body_timeout=30.0, max_connections=100, max_body=1024**2, max_body_memory=64 * 1024**2
    )
    for value in ENVIRON.values():
        assert value not in repr(config)


@pytest.mark.parametrize(
    ("written", "share"),
    [
        ("", 512),  # a quarter of the default 2048
        ("max_connections: 100", 25),  # follows max_connections when only that is set
        ("max_connections: 2", 1),  # never none
        ("max_connections: 8\nmax_connections_per_client: 8", 8),
        ("max_connections_per_client: 40", 40),
    ],
)
def test_a_client_s_share_of_the_connections(written: str, share: int) -> None:
    config = parse_config(yaml.safe_load(MINIMAL + written + "\n"))
    assert config.limits.max_connections_per_client == share


def test_the_limits_carry_the_trusted_proxies_exempt_from_the_share() -> None:
    config = parse_config(yaml.safe_load(MINIMAL + "trusted_proxies: [10.0.0.0/8]\n"))
    assert config.limits.trusted_proxies == config.trusted_proxies
    assert [str(n) for n in config.limits.trusted_proxies] == ["10.0.0.0/8"]
    # However the config is made (a reload keeping fixed keys makes it anew).
    again = attrs.evolve(config, trusted_proxies=())
    assert again.limits.trusted_proxies == () and again.limits == config.limits


def test_defaults_leave_everything_open_with_limits() -> None:
    config = parse_config(yaml.safe_load(MINIMAL))
    assert config.routes["opencode-a"].api_keys == ()
    assert config.status_keys == ()
    assert config.status_listen is None
    assert config.trusted_proxies == ()
    assert config.limits == Limits(
        body_timeout=60.0,
        max_connections=2048,
        max_body=16 * 1024**2,
        max_body_memory=256 * 1024**2,
    )


def test_a_host_key_and_ca(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "lab-ca.pem").write_bytes(self_signed_ca())
    monkeypatch.setenv("HOST_KEY", "host-secret-4")
    text = MINIMAL.replace(
        "  gpu-b: http://10.0.0.12:8080/",
        "  gpu-b:\n    url: https://gpu-b.lab:8443\n"
        "    api_key: ${HOST_KEY}\n    tls_ca: lab-ca.pem",
    )
    config = load_config(write(tmp_path, text))
    host = config.hosts["gpu-b"]
    assert host.api_key is not None and host.api_key.value == b"host-secret-4"
    assert host.tls_ca == (tmp_path / "lab-ca.pem").read_bytes()  # relative to the config
    assert host.tls_ca_path == str(tmp_path / "lab-ca.pem")
    assert config.hosts["gpu-a"].api_key is None


SECURITY_MISTAKES = [
    (
        ("poll_interval: 5s", 'api_keys: ["${NOPE_UNSET}"]'),
        "api_keys[0]",
        "environment variable NOPE_UNSET is not set",
    ),
    (
        ("poll_interval: 5s", "api_keys:\n  - ${NOPE_UNSET}"),
        "api_keys[0]",
        "environment variable NOPE_UNSET is not set",
    ),
    (("poll_interval: 5s", "api_keys: key"), "api_keys", "must be a list of keys, not str"),
    (("poll_interval: 5s", "api_keys: [7]"), "api_keys[0]", "must be a string"),
    (("poll_interval: 5s", "status_keys: ['']"), "status_keys[0]", "is empty"),
    (
        ("    default_model", "    api_keys: [ok, 'two words']\n    default_model"),
        "routes.opencode-a.api_keys[1]",
        "printable ASCII without spaces",
    ),
    (
        ("  gpu-b: http://10.0.0.12:8080/", "  gpu-b: {url: 'http://u:hunter2@h:1'}"),
        "hosts.gpu-b.url",
        "must not carry credentials (give the host an api_key): 'http://u:****@h:1'",
    ),
    (
        ("  gpu-b: http://10.0.0.12:8080/", "  gpu-b: 'http://u:hunter2@h:99999'"),
        "hosts.gpu-b",
        "'http://u:****@h:99999'",
    ),
    (
        ("  gpu-b: http://10.0.0.12:8080/", "  gpu-b: 'ftp://u:hunter2@h'"),
        "hosts.gpu-b",
        "not 'ftp://u:****@h'",
    ),
    (
        ("  gpu-b: http://10.0.0.12:8080/", "  gpu-b: {url: 'http://h', tls_ca: ca.pem}"),
        "hosts.gpu-b.tls_ca",
        "is only for https:// hosts",
    ),
    (
        ("  gpu-b: http://10.0.0.12:8080/", "  gpu-b: {url: 'https://h', tls_ca: nope.pem}"),
        "hosts.gpu-b.tls_ca",
        "cannot read",
    ),
    (
        ("  gpu-b: http://10.0.0.12:8080/", "  gpu-b: {url: 'https://h', api_key: [x]}"),
        "hosts.gpu-b.api_key",
        "must be a string",
    ),
    (("poll_interval: 5s", "max_body_memory: lots"), "max_body_memory", "not a size"),
    (("poll_interval: 5s", "max_body_memory: 0"), "max_body_memory", "more than zero"),
    (
        ("poll_interval: 5s", "max_body: 2MiB\nmax_body_memory: 1MiB"),
        "max_body",
        "must not be more than max_body_memory",
    ),
    (("poll_interval: 5s", "max_connections: 0"), "max_connections", "at least 1"),
    (
        ("poll_interval: 5s", "max_connections_per_client: 0"),
        "max_connections_per_client",
        "at least 1",
    ),
    (
        ("poll_interval: 5s", "max_connections: 100\nmax_connections_per_client: 101"),
        "max_connections_per_client",
        "must not be more than max_connections (100)",
    ),
    (
        ("poll_interval: 5s", "max_connections_per_client: 3000"),
        "max_connections_per_client",
        "must not be more than max_connections (2048)",
    ),
    (("poll_interval: 5s", "body_timeout: soon"), "body_timeout", "not a duration"),
    (
        ("poll_interval: 5s", "trusted_proxies: [10.0.0.0/33]"),
        "trusted_proxies",
        "item 0: not an address or CIDR block",
    ),
    (("poll_interval: 5s", "trusted_proxies: 10.0.0.1"), "trusted_proxies", "must be a list"),
    (("poll_interval: 5s", "status_listen: 7777"), "status_listen", "must differ from listen"),
]


@pytest.mark.parametrize(("change", "key", "problem"), MISTAKES + SECURITY_MISTAKES)
def test_mistakes_name_key_and_problem(
    tmp_path: Path, change: tuple[str, str], key: str, problem: str
) -> None:
    old, new = change
    assert old in MINIMAL
    message = error_of(tmp_path, MINIMAL.replace(old, new, 1))
    assert message.startswith(f"{key}: "), message
    assert problem in message
    assert "hunter2" not in message  # a URL's password is never shown


@pytest.mark.parametrize("password", ["hunter/2", "hunter?2", "hunter#2", "hunter@2", "h /'2"])
@pytest.mark.parametrize("form", ["  gpu-b: {url: '%s'}", '  gpu-b: "%s"'])
def test_a_url_password_is_never_quoted(tmp_path: Path, password: str, form: str) -> None:
    """Audit finding 10: a password with a character that ends urllib's authority was
    quoted whole, and in urllib's own words too (``Port could not be cast ... 'hunter'``)."""
    url = f"https://admin:{password}@gpu-b.lab:8443/v1"
    line = form % url.replace("'", "''") if "{" in form else form % url
    message = error_of(tmp_path, MINIMAL.replace("  gpu-b: http://10.0.0.12:8080/", line))
    key = "hosts.gpu-b.url" if "{" in form else "hosts.gpu-b"
    assert message == (
        f"{key}: must not carry credentials (give the host an api_key): "
        "'https://admin:****@gpu-b.lab:8443/v1'"
    )
    assert "hunter" not in message


@pytest.mark.parametrize(
    ("line", "shown"),
    [
        (
            "  gpu-b: 'https://[admin:hunter/2@gpu-b'",
            "not a valid URL: 'https://[admin:****@gpu-b'",
        ),
        ("  gpu-b: 'ftp://admin:hunter/2@gpu-b'", "not 'ftp://admin:****@gpu-b'"),
        ("  gpu b: 'http://h'\n  x: 'http://u:hunter/2@h'", "hosts.gpu b:"),
        ("  gpu-b: http://h\nhealth_path: 'http://u:hunter/2@h'", "'http://u:****@h'"),
        ("  gpu-b: http://h\nstatus_listen: 'http://u:hunter/2@h'", "in 'http://u:****@h'"),
    ],
)
def test_a_url_password_is_masked_in_any_error(tmp_path: Path, line: str, shown: str) -> None:
    """Wherever a URL is quoted: urllib's refusal, another scheme, a key it was not for."""
    message = error_of(tmp_path, MINIMAL.replace("  gpu-b: http://10.0.0.12:8080/", line))
    assert shown in message
    assert "hunter" not in message


def test_cache_affinity_and_slots(tmp_path: Path) -> None:
    text = MINIMAL.replace(
        "    default_model",
        "    policy: cache_affinity\n    affinity_max_load: 2\n    default_model",
    ).replace(
        "  gpu-b: http://10.0.0.12:8080/", "  gpu-b: {url: 'http://10.0.0.12:8080', slots: 4}"
    )
    config = load_config(write(tmp_path, text))
    route = config.routes["opencode-a"]
    assert (route.policy, route.affinity_max_load) == ("cache_affinity", 2.0)
    assert config.hosts["gpu-b"].slots == 4
    assert config.hosts["gpu-a"].slots is None
    assert parse_config(yaml.safe_load(MINIMAL)).routes["opencode-a"].affinity_max_load == 1.5
    assert route.home_wait == HOME_WAIT  # the default
    for written, seconds in (("2s", 2.0), ("250ms", 0.25), ("0", 0.0), (0, 0.0)):
        changed = text.replace("affinity_max_load: 2", f"home_wait: {written!r}")
        assert load_config(write(tmp_path, changed)).routes["opencode-a"].home_wait == seconds


@pytest.mark.parametrize(
    ("change", "key", "problem"),
    [
        (
            ("    default_model", "    affinity_max_load: 2\n    default_model"),
            "routes.opencode-a.affinity_max_load",
            "is only for policy cache_affinity",
        ),
        (
            (
                "    default_model",
                "    policy: cache_affinity\n    affinity_max_load: 0.5\n    default_model",
            ),
            "routes.opencode-a.affinity_max_load",
            "must be a number from 1 to 100, not 0.5",
        ),
        (
            ("  gpu-b: http://10.0.0.12:8080/", "  gpu-b: {url: 'http://h:1', slots: 0}"),
            "hosts.gpu-b.slots",
            "at least 1",
        ),
        (
            ("    default_model", "    home_wait: 1s\n    default_model"),
            "routes.opencode-a.home_wait",
            "is only for policy cache_affinity",
        ),
        (
            (
                "    default_model",
                "    policy: cache_affinity\n    home_wait: 2m\n    default_model",
            ),
            "routes.opencode-a.home_wait",
            "must be at most 60s, not '2m'",
        ),
        (
            (
                "    default_model",
                "    policy: cache_affinity\n    home_wait: soon\n    default_model",
            ),
            "routes.opencode-a.home_wait",
            "not a duration",
        ),
    ],
)
def test_affinity_mistakes_name_key_and_problem(
    tmp_path: Path, change: tuple[str, str], key: str, problem: str
) -> None:
    old, new = change
    message = error_of(tmp_path, MINIMAL.replace(old, new, 1))
    assert message.startswith(f"{key}: "), message
    assert problem in message


def test_an_unquoted_variable_in_brackets_gets_a_hint(tmp_path: Path) -> None:
    message = error_of(tmp_path, MINIMAL + "api_keys: [${LAB_KEY}]\n")
    assert message.startswith("YAML syntax error: line 10: ")
    assert message.endswith('(write a ${VARIABLE} in quotes: ["${VARIABLE}"])')


def test_a_bad_key_never_shows_its_value(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LAB_KEY", "has a space in it")
    message = error_of(tmp_path, MINIMAL + 'api_keys: ["${LAB_KEY}"]\n')
    assert message == (
        "api_keys[0]: must be printable ASCII without spaces (${LAB_KEY}; the value is not shown)"
    )


_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True),
    st.text(max_size=20),
    st.sampled_from(["7777", "5s", "tcp:1", "http://h:1", "gpu-a", "${X}", "1MiB", "::1"]),
)


_KEYS = st.sampled_from(
    [*sorted(_TOP_KEYS), "url", "api_key", "tls_ca", "gpu-a", "r", "policy", "x"]
)


_DOCS = st.recursive(
    _SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_KEYS, inner, max_size=6),
    max_leaves=25,
)


_HOST_KEYS = ["url", "api_key", "tls_ca", "max_fails", "poll_interval"]


_ROUTE_KEYS = ["hosts", "default_model", "policy", "api_keys", "list_models"]


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    top=st.dictionaries(st.sampled_from(sorted(_TOP_KEYS - {"hosts", "routes"})), _DOCS),
    host=st.one_of(_DOCS, st.dictionaries(st.sampled_from(_HOST_KEYS), _DOCS)),
    route=st.one_of(_DOCS, st.dictionaries(st.sampled_from(_ROUTE_KEYS), _DOCS)),
    which=st.sampled_from(["top", "host", "route"]),
)
def test_any_document_is_a_config_or_one_config_error(
    top: dict[str, object], host: object, route: object, which: str
) -> None:
    """Whatever YAML gives in any key of a valid config, loading ends in a Config or a
    one-line ConfigError."""
    doc = yaml.safe_load(MINIMAL)
    if which == "top":
        doc.update(top)
    elif which == "host":
        doc["hosts"]["gpu-b"] = host
    else:
        doc["routes"]["opencode-a"] = route
    try:
        parse_config(doc)
    except ConfigError as e:
        assert len(str(e).splitlines()) == 1, str(e)


_YAML = ["hosts:", "routes:", "gpu-a", "[", "]", "{", "}", ",", ": ", "- ", "'", '"', "\\n"]


_MORE = ["\n", "  ", "\t", "&a ", "*a", "!!str ", "!!timestamp ", "#", "? ", "|", "---", "..."]


_ODD = ["http://u:p/s@h", "5s", "2024-13-01", "${X}", "\r", "\x85", "\u2028", "\x00", "é"]


_PIECES = st.sampled_from([*_YAML, *_MORE, *_ODD])


@settings(max_examples=600, deadline=None)
@given(text=st.one_of(st.text(max_size=200), st.lists(_PIECES, max_size=40).map("".join)))
@example(text=UNCLOSED + "\n")
@example(text='"a\\u2028b": 1')
def test_any_file_is_a_config_or_one_config_error(text: str) -> None:
    """The same from a file's text, random or made of YAML's pieces: YAML errors, aliases
    and duplicate keys included. The error is one line however the text splits lines."""
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "crossbar.yaml"
        path.write_text(text, encoding="utf-8")
        try:
            load_config(path)
        except ConfigError as e:
            assert len(str(e).splitlines()) == 1, str(e)


def test_a_default_follows_the_limits_the_admin_wrote(tmp_path: Path) -> None:
    """``max_body_memory: 1MiB`` alone once stopped start-up: ``max_body``'s default (16 MiB)
    was more. A default gives way; only values the admin wrote can conflict."""
    alone = load_config(write(tmp_path, MINIMAL + "max_body_memory: 1MiB\n"))
    assert (alone.limits.max_body, alone.limits.max_body_memory) == (1024 * 1024, 1024 * 1024)
    both = MINIMAL + "max_body_memory: 1MiB\nmax_body: 2MiB\n"
    assert error_of(tmp_path, both) == "max_body: must not be more than max_body_memory"


def test_a_key_may_name_its_holder_and_their_share(tmp_path: Path) -> None:
    text = MINIMAL + textwrap.dedent(
        """\
        api_keys:
          - {name: alice, key: alice-key-0123456789, priority: interactive, max_in_flight: 8}
          - plain-key-0123456789
        """
    )
    config = load_config(write(tmp_path, text))
    alice, plain = config.routes["opencode-a"].api_keys
    assert alice.holder is not None and plain.holder is None
    assert (alice.holder.name, alice.holder.priority, alice.holder.max_in_flight) == (
        "alice",
        "interactive",
        8,
    )
    assert alice.holder.max_waiting is None
    assert "alice-key" not in repr(config) and "alice-key" not in str(effective(config))
    assert "alice: literal (****)" in str(effective(config))


@pytest.mark.parametrize(
    ("entry", "problem"),
    [
        ("{key: k-0123456789}", "api_keys[0].name: is missing"),
        ("{name: alice}", "api_keys[0].key: is missing"),
        ("{name: 'a b', key: k-0123456789}", "api_keys[0].name: must be 1 to 64 letters"),
        ("{name: a, key: k-0123456789, priority: urgent}", "api_keys[0].priority: must be one of"),
        ("{name: a, key: k-0123456789, max_waiting: 0}", "api_keys[0].max_waiting: must be"),
        ("{name: a, key: k-0123456789, colour: red}", "api_keys[0].colour: unknown key"),
    ],
)
def test_a_named_key_that_is_wrong_stops_start_up_in_one_line(
    tmp_path: Path, entry: str, problem: str
) -> None:
    assert error_of(tmp_path, MINIMAL + f"api_keys: [{entry}]\n").startswith(problem)


def test_a_route_s_queue_keys_are_checked(tmp_path: Path) -> None:
    route = "    queue: false\n    max_waiting: 10\n    wait_timeout: 30s\n"
    config = load_config(write(tmp_path, MINIMAL + route))
    lab = config.routes["opencode-a"]
    assert (lab.queue, lab.max_waiting, lab.wait_timeout) == (False, 10, 30.0)
    wrong = MINIMAL + "    max_waiting: -1\n"
    assert error_of(tmp_path, wrong).startswith("routes.opencode-a.max_waiting: must be")


def test_spillover_is_off_unless_a_route_turns_it_on(tmp_path: Path) -> None:
    assert not load_config(write(tmp_path, MINIMAL)).routes["opencode-a"].spillover
    config = load_config(write(tmp_path, MINIMAL + "    spillover: true\n"))
    assert config.routes["opencode-a"].spillover
    wrong = MINIMAL + "    spillover: sometimes\n"
    assert error_of(tmp_path, wrong).startswith("routes.opencode-a.spillover: must be")


def test_models_max_is_a_host_setting(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, MINIMAL.replace("poll_interval: 5s", "models_max: 2")))
    assert {s.models_max for s in config.settings.values()} == {2}


# -- which models a route or a key may ask for, and how many loads (audit 3, finding 9) ----


def test_model_allowlists_idle_before_evict_and_loads_a_minute_are_read(tmp_path: Path) -> None:
    text = MINIMAL + textwrap.dedent(
        """\
            models: [qwen3-*, "*/Llama-3*"]
            min_idle_before_evict: 2m
        api_keys:
          - name: alice
            key: alice-key-0123456789
            models: [qwen3-coder-*]
            max_loads_per_minute: 3
          - plain-key-0123456789
        """
    )
    config = load_config(write(tmp_path, text))
    route = config.routes["opencode-a"]
    assert (route.models, route.min_idle_before_evict) == (("qwen3-*", "*/Llama-3*"), 120.0)
    alice, plain = route.api_keys
    assert alice.holder is not None and plain.holder is None
    assert (alice.holder.models, alice.holder.max_loads_per_minute) == (("qwen3-coder-*",), 3)
    shown = effective(config)["routes"]["opencode-a"]
    assert (shown["models"], shown["min_idle_before_evict"]) == (["qwen3-*", "*/Llama-3*"], 120.0)


def test_without_them_every_model_and_a_30_s_idle_before_evict(tmp_path: Path) -> None:
    route = load_config(write(tmp_path, MINIMAL)).routes["opencode-a"]
    assert (route.models, route.min_idle_before_evict) == ((), 30.0)
    zero = load_config(write(tmp_path, MINIMAL + "    min_idle_before_evict: 0\n"))
    assert zero.routes["opencode-a"].min_idle_before_evict == 0.0


@pytest.mark.parametrize(
    ("lines", "problem"),
    [
        ("    models: []\n", "routes.opencode-a.models: must be a non-empty list"),
        ("    models: qwen3-*\n", "routes.opencode-a.models: must be a non-empty list"),
        ("    models: [qwen3, 7]\n", "routes.opencode-a.models: item 1: must be a model name"),
        ("    models: ['']\n", "routes.opencode-a.models: item 0: must be a model name"),
        ('    models: ["a\\tb"]\n', "routes.opencode-a.models: item 0: must be at most 256"),
        ("    min_idle_before_evict: soon\n", "routes.opencode-a.min_idle_before_evict: not a"),
        ("    min_idle_before_evict: -5\n", "routes.opencode-a.min_idle_before_evict: must be"),
        (
            "api_keys: [{name: a, key: k-0123456789, max_loads_per_minute: 0}]\n",
            "api_keys[0].max_loads_per_minute: must be a whole number of at least 1",
        ),
        (
            "api_keys: [{name: a, key: k-0123456789, models: [m, {x: 1}]}]\n",
            "api_keys[0].models: item 1: must be a model name",
        ),
    ],
)
def test_an_allowlist_or_budget_that_is_wrong_stops_start_up_in_one_line(
    tmp_path: Path, lines: str, problem: str
) -> None:
    assert error_of(tmp_path, MINIMAL + lines).startswith(problem)


def test_aliases_keep_the_order_they_are_written_in(tmp_path: Path) -> None:
    text = MINIMAL + '    aliases: {"claude-haiku-*": small, "claude-*": big, gpt-5*: big}\n'
    route = load_config(write(tmp_path, text)).routes
    [lab] = route.values()
    assert lab.aliases == (("claude-haiku-*", "small"), ("claude-*", "big"), ("gpt-5*", "big"))


@pytest.mark.parametrize(
    ("aliases", "problem"),
    [
        ("[claude-*]", "must be a mapping of name patterns to models"),
        ("{claude-*: 3}", "claude-*: must be the model it stands for, a string, not 3"),
        ("{claude-*: qwen-*}", "claude-*: must be one model's id, not a pattern"),
        ('{"": qwen}', "pattern '': must be a model name or a glob pattern"),
    ],
)
def test_a_bad_alias_is_one_line_naming_the_key(tmp_path: Path, aliases: str, problem: str) -> None:
    message = error_of(tmp_path, MINIMAL + f"    aliases: {aliases}\n")
    assert message.startswith("routes.")
    assert ".aliases: " + problem in message

"""Reading crossbar.yaml from its file: the text, its one YAML document (a key written twice
refused), and every way that can fail as one line naming the file, where, and what."""

from __future__ import annotations

from pathlib import Path

import yaml

from crossbar.config.load import ConfigError, _join, parse_config
from crossbar.config.model import Config


def load_config(path: str | Path) -> Config:
    """Read and check a config file; every failure is a :class:`ConfigError`."""
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(source, "", "no such file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(source, "", f"cannot read: {e}") from None
    try:
        data = _document(text, source)
    except yaml.YAMLError as e:
        raise ConfigError(source, "", f"YAML syntax error: {_yaml_problem(e, text)}") from None
    except RecursionError:
        raise ConfigError(source, "", "YAML nested too deeply to read") from None
    except (ValueError, TypeError, AttributeError) as e:
        # What PyYAML's constructors let through: a date such as 2024-13-01 (a ValueError
        # in words), a !!timestamp that is not one, an integer over 4300 digits.
        raise ConfigError(
            source, "", f"YAML value that cannot be read: {_value_problem(e)}"
        ) from None
    return parse_config(data, source, Path(path).parent)


def _document(text: str, source: str) -> object:
    """The YAML document of ``text``, a key written twice refused."""
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _no_duplicate_keys(node, "", source)
        return loader.construct_document(node)
    finally:
        loader.dispose()


def _yaml_problem(e: yaml.YAMLError, text: str) -> str:
    """Where and what, in one line: a line of the file, or its end (then where the
    unclosed part began), and a hint for an unquoted ``${VARIABLE}``."""
    mark = getattr(e, "problem_mark", None)
    problem = getattr(e, "problem", None) or str(e).splitlines()[0]
    if mark is None:
        return problem
    lines = text.splitlines()
    if mark.line >= len(lines):  # a file ending in a newline ends after its last line
        context, begun = getattr(e, "context", None), getattr(e, "context_mark", None)
        if context and begun is not None:
            problem += f" ({context} begun on line {begun.line + 1})"
        return f"at the end of the file: {problem}"
    begun = getattr(e, "context_mark", None)
    if getattr(e, "context", None) == "while scanning a simple key" and begun is not None:
        # A key without its ':' is found missing where the next line begins: the
        # line at fault is the key's own.
        mark = begun
    if "${" in lines[mark.line]:
        problem += ' (write a ${VARIABLE} in quotes: ["${VARIABLE}"])'
    return f"line {mark.line + 1}: {problem}"


def _value_problem(e: Exception) -> str:
    text = str(e)
    if "integer string conversion" in text:
        return "a number of more than 4300 digits"
    return text if isinstance(e, ValueError) and text else "a tagged value of the wrong form"


def _no_duplicate_keys(
    node: yaml.Node, key: str, source: str, walked: set[int] | None = None
) -> None:
    """YAML lets the last of two equal keys win silently: a second ``gpu-a`` under
    ``hosts`` would replace the first. Refuse it, naming where. (A node an alias
    repeats is walked once: aliases may even refer to themselves.)"""
    walked = set() if walked is None else walked
    if id(node) in walked:
        return
    walked.add(id(node))
    if isinstance(node, yaml.MappingNode):
        seen: set[object] = set()
        for name_node, value_node in node.value:
            name = name_node.value if isinstance(name_node, yaml.ScalarNode) else None
            path = _join(key, str(name)) if name is not None else key
            if name is not None:
                if name in seen:
                    raise ConfigError(source, path, "duplicate key")
                seen.add(name)
            _no_duplicate_keys(value_node, path, source, walked)
    elif isinstance(node, yaml.SequenceNode):
        for item in node.value:
            _no_duplicate_keys(item, key, source, walked)

"""The house rules of crossbar's source tree, checked on the files themselves (read with
``ast``, nothing imported): every module has its test module, packages and modules stay
small, no public class name is defined twice, packages import each other through their
faces, and each face names what it offers in ``__all__``. Each check names the files that
break it."""

from __future__ import annotations

import ast
import tomllib
from collections import defaultdict
from collections.abc import Iterator
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCE = ROOT / "crossbar"
TESTS = ROOT / "tests"

MAX_MODULES = 15
MAX_LINES = 400

# ``__main__`` is its package's command line, tested by running it: the test named here.
COMMAND_LINES = {
    "crossbar/testing/simulator/__main__.py": "tests/system/test_testing_cli.py",
    "crossbar/workers/__main__.py": "tests/system/test_workers.py",
    "crossbar/clients/__main__.py": "tests/unit/clients/test_settings.py",
}

# Known exceptions, each with its reason. One that no longer holds must leave its list:
# the ``test_modules_excused_*`` tests say which.
WITHOUT_TESTS_YET: dict[str, str] = {}
LONG_YET: dict[str, str] = {}


def relative(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def modules() -> Iterator[Path]:
    """Every module of crossbar, its packages' ``__init__`` left out."""
    for path in sorted(SOURCE.rglob("*.py")):
        if path.name != "__init__.py":
            yield path


def packages() -> list[Path]:
    return sorted(path.parent for path in SOURCE.rglob("__init__.py"))


def dotted(path: Path) -> str:
    """``crossbar/routing/policies.py`` -> ``crossbar.routing.policies``; a package's
    ``__init__`` is the package."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


@cache
def parsed(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), filename=relative(path))


def report(broken: list[str] | dict[str, object], rule: str) -> str:
    lines = broken.items() if isinstance(broken, dict) else ((line, None) for line in broken)
    shown = [f"  {name}: {why}" if why is not None else f"  {name}" for name, why in lines]
    return f"{rule}; these break it:\n" + "\n".join(shown)


# -- every module has its test module ---------------------------------------------------------


def homes_of(path: Path) -> list[Path]:
    """Where a module's test may be: ``tests/unit/<package path>/test_<module>.py`` or
    ``tests/system/test_<module>.py`` (a leading underscore dropped); a command line's, the
    test named in COMMAND_LINES."""
    rel = relative(path)
    if rel in COMMAND_LINES:
        return [ROOT / COMMAND_LINES[rel]]
    inside = path.relative_to(SOURCE)
    name = "test_" + path.stem.lstrip("_") + ".py"
    return [TESTS / "unit" / inside.parent / name, TESTS / "system" / name]


def untested() -> list[str]:
    return [
        relative(path) for path in modules() if not any(home.is_file() for home in homes_of(path))
    ]


def test_every_module_has_its_test_module() -> None:
    missing = [rel for rel in untested() if rel not in WITHOUT_TESTS_YET]
    assert not missing, report(
        {rel: " or ".join(relative(h) for h in homes_of(ROOT / rel)) for rel in missing},
        "every module has its test module (module: where it is looked for)",
    )


def test_modules_excused_from_tests_are_still_excused_for_a_reason() -> None:
    """An exception that no longer holds (the module has its test now, or is gone) leaves
    the list, so the list says what is still to do."""
    still = set(untested())
    stale = [rel for rel in WITHOUT_TESTS_YET if rel not in still]
    assert not stale, report(
        stale, "remove these from WITHOUT_TESTS_YET: they have tests now, or are gone"
    )


# -- small packages, short modules ------------------------------------------------------------


def test_no_package_holds_more_than_15_modules() -> None:
    crowded = {}
    for package in packages():
        count = sum(1 for path in package.glob("*.py") if path.name != "__init__.py")
        if count > MAX_MODULES:
            crowded[relative(package)] = f"{count} modules"
    assert not crowded, report(crowded, f"a package holds at most {MAX_MODULES} modules")


def lengths() -> dict[str, int]:
    return {
        relative(path): len(path.read_text(encoding="utf-8").splitlines())
        for path in sorted(SOURCE.rglob("*.py"))
    }


def test_every_module_is_under_400_lines() -> None:
    long = {
        rel: f"{lines} lines"
        for rel, lines in lengths().items()
        if lines >= MAX_LINES and rel not in LONG_YET
    }
    assert not long, report(long, f"a module is under {MAX_LINES} lines")


def test_modules_excused_from_length_are_still_long() -> None:
    stale = [rel for rel in LONG_YET if lengths().get(rel, 0) < MAX_LINES]
    assert not stale, report(stale, "remove these from LONG_YET: they are short now, or gone")


# -- one name per class -----------------------------------------------------------------------


def test_no_public_class_name_is_defined_twice() -> None:
    where: dict[str, list[str]] = defaultdict(list)
    for path in sorted(SOURCE.rglob("*.py")):
        for node in parsed(path).body:
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                where[node.name].append(relative(path))
    twice = {name: ", ".join(paths) for name, paths in where.items() if len(paths) > 1}
    assert not twice, report(twice, "a public class name is defined once in crossbar")


# -- faces ------------------------------------------------------------------------------------


def pure_modules() -> list[str]:
    """The modules (or packages) of the "Pure rules do no I/O" import contract."""
    with (ROOT / "pyproject.toml").open("rb") as f:
        contracts = tomllib.load(f)["tool"]["importlinter"]["contracts"]
    (pure,) = [c for c in contracts if c["name"].startswith("Pure rules do no I/O")]
    return list(pure["source_modules"])


def is_pure(module: str, pure: list[str]) -> bool:
    return any(module == name or module.startswith(name + ".") for name in pure)


def faces() -> dict[str, Path]:
    """Every package's dotted name and its ``__init__``."""
    return {dotted(package / "__init__.py"): package / "__init__.py" for package in packages()}


def top_package(module: str) -> str:
    """The package (or top-level module) of crossbar a dotted name belongs to:
    ``crossbar.routing.policies`` -> ``crossbar.routing``; ``crossbar.service`` -> itself."""
    return ".".join(module.split(".")[:2])


def crossbar_imports(tree: ast.Module) -> Iterator[tuple[int, str, list[str]]]:
    """Each import of crossbar in a module (TYPE_CHECKING ones too): line, module, names."""
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "crossbar" or node.module.startswith("crossbar."):
                yield node.lineno, node.module, [alias.name for alias in node.names]
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("crossbar."):
                    yield node.lineno, alias.name, []


def deep_imports() -> list[str]:
    pure = pure_modules()
    face_names = faces()
    broken = []
    for path in sorted(SOURCE.rglob("*.py")):
        here = dotted(path)
        for line, target, _names in crossbar_imports(parsed(path)):
            if top_package(target) == top_package(here) or target in face_names:
                continue
            if is_pure(here, pure) and is_pure(target, pure):
                continue
            if target.count(".") >= 2:
                broken.append(f"{relative(path)}:{line} imports {target}")
    return broken


def test_packages_import_each_other_through_their_faces() -> None:
    """``from crossbar.routing import X``, not ``from crossbar.routing.policies import X``;
    a pure module may import another pure module itself."""
    broken = deep_imports()
    assert not broken, report(
        broken, "a module imports another package's names from its face (its __init__)"
    )


def defined_names(tree: ast.Module) -> set[str]:
    """The names a module binds at its top level."""
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.ImportFrom | ast.Import):
            names.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
    return names


def all_of(tree: ast.Module) -> list[str] | None:
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
        ):
            return [ast.literal_eval(item) for item in node.value.elts]  # type: ignore[attr-defined]
    return None


def test_every_package_names_its_entry_points_in_all() -> None:
    broken = {}
    for package in packages():
        init = package / "__init__.py"
        if package == SOURCE:
            continue  # crossbar itself offers only its version
        tree = parsed(init)
        names = all_of(tree)
        if names is None:
            broken[relative(init)] = "no __all__"
            continue
        missing = sorted(set(names) - defined_names(tree))
        if missing:
            broken[relative(init)] = f"__all__ names what it does not define: {missing}"
        if len(set(names)) != len(names):
            broken[relative(init)] = "__all__ names a name twice"
    assert not broken, report(broken, "each package's __init__ defines __all__, all importable")


def test_names_taken_from_another_package_are_in_its_all() -> None:
    """Another package takes only what a face offers in ``__all__``, not a submodule
    or a helper the face happens to import."""
    face_names = faces()
    offered = {name: set(all_of(parsed(init)) or []) for name, init in face_names.items()}
    broken = []
    for path in sorted(SOURCE.rglob("*.py")):
        here = dotted(path)
        for line, target, names in crossbar_imports(parsed(path)):
            if target not in face_names or target == "crossbar":
                continue
            if top_package(target) == top_package(here):
                continue
            extra = sorted(set(names) - offered[target])
            if extra:
                broken.append(f"{relative(path)}:{line} takes {extra} from {target}")
    assert not broken, report(broken, "names taken from another package are in its __all__")


# -- test modules share helpers through tests/support only -------------------------------------


def file_under_tests(module: str) -> Path | None:
    """The file under ``tests/`` of the dotted ``module``, if it is one there."""
    base = ROOT.joinpath(*module.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file() and path.is_relative_to(TESTS):
            return path
    return None


def imported_test_files(path: Path) -> Iterator[tuple[int, Path]]:
    """Each file under ``tests/`` that ``path`` imports (a name from a module counts as
    that module), with the line that imports it."""
    package = dotted(path).split(".")
    if path.name != "__init__.py":
        package.pop()
    for node in ast.walk(parsed(path)):
        if isinstance(node, ast.Import):
            found = [file_under_tests(alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            parent = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join([*parent, *([node.module] if node.module else [])])
            found = [
                file_under_tests(f"{module}.{alias.name}") or file_under_tests(module)
                for alias in node.names
            ]
        else:
            continue
        for target in dict.fromkeys(found):
            if target is not None:
                yield node.lineno, target


def test_test_modules_share_helpers_only_through_tests_support() -> None:
    """A helper several test modules use lives in ``tests/support/`` (or a ``conftest.py``):
    no other module under ``tests/`` is imported by another."""
    support = TESTS / "support"
    broken = [
        f"{relative(path)}:{line} imports {relative(target)}"
        for path in sorted(TESTS.rglob("*.py"))
        for line, target in imported_test_files(path)
        if target != path and not target.is_relative_to(support) and target.name != "conftest.py"
    ]
    assert not broken, report(broken, "test modules import helpers only from tests/support/")

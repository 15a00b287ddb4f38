"""The layout of the package: layers, cycles, what gets installed, the error tree.

* Imports point one way (DESIGN.md, "Where things live"): ``eventstore`` uses
  nothing of ours, ``projections`` and ``agents`` use ``eventstore``, ``bus``
  uses those three, ``tools`` uses everything; no module of the five imports
  the root facade ``cardbus``. Every module is parsed (imports inside
  functions and ``TYPE_CHECKING`` blocks count, and so do dotted strings such
  as ``"cardbus.tools.cmd_run"`` that name one of our modules).
* No cycle between packages: the packages' import graph is acyclic (a
  package's ``__init__`` re-exporting its own subpackages is containment, not
  a dependency), and no import cycle of modules spans two packages.
* Every folder with an ``__init__.py`` is in pyproject's ``packages`` list, and
  the installed distribution puts nothing but ``cardbus`` at the top level.
* Every public exception class derives from ``CardbusError``, except the two
  signals the errors module's docstring names.

The checkers are pure functions of source text or module objects, and each
has a unit test on a small bad example, so each real check can fail.
"""

from __future__ import annotations

import ast
import importlib
import importlib.metadata
import importlib.util
import inspect
import os
import pkgutil
import re
import shutil
import subprocess
import sys
import tomllib
import types
import zipfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LAYERS = ("eventstore", "projections", "agents", "bus", "tools")
# layer -> the layers it may import (besides itself)
MAY_USE: dict[str, frozenset[str]] = {
    "eventstore": frozenset(),
    "projections": frozenset({"eventstore"}),
    "agents": frozenset({"eventstore"}),
    "bus": frozenset({"eventstore", "projections", "agents"}),
    "tools": frozenset({"eventstore", "projections", "agents", "bus"}),
}
# exceptions that are signals, not errors (eventstore/errors.py's docstring says so)
SIGNALS = {
    ("cardbus.agents.agent", "Reject"),
    ("cardbus.agents.agent", "NeedsInput"),
    ("cardbus.agents.questions", "AskPerson"),  # a NeedsInput that asks a person
}
_DOTTED = re.compile(r"cardbus(?:\.[A-Za-z_]\w*)+(?::[A-Za-z_]\w*)?")


# -- the checkers ------------------------------------------------------------------


@dataclass(frozen=True)
class Module:
    name: str  # cardbus.bus.orchestrator.core
    is_package: bool  # an __init__.py
    source: str
    path: str = ""

    @property
    def package(self) -> str:
        return self.name if self.is_package else self.name.rpartition(".")[0]

    @property
    def layer(self) -> str:
        return layer_of(self.name)


@dataclass(frozen=True)
class Edge:
    source: str
    target: str
    line: int


def layer_of(module: str) -> str:
    """``cardbus.bus.transport.nats`` -> ``bus``; the root package -> ``cardbus``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def modules_on_disk(root: Path = ROOT) -> list[Module]:
    out = []
    for layer in LAYERS:
        for path in sorted((root / layer).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if "__pycache__" in parts:
                continue
            is_package = parts[-1] == "__init__"
            if is_package:
                parts.pop()
            out.append(
                Module(
                    "cardbus." + ".".join(parts),
                    is_package,
                    path.read_text(encoding="utf-8"),
                    str(path.relative_to(root)),
                )
            )
    return out


def imports(modules: Iterable[Module]) -> list[Edge]:
    """Every import of one of ``modules`` by another (or of the root ``cardbus``).

    ``from a.b import c`` is an import of ``a.b.c`` when that is a module, else of
    ``a.b``; relative imports are resolved; a string constant that is a dotted
    name of one of the modules (``"cardbus.tools.cmd_run"``,
    ``"cardbus.agents.demo:Researcher"``) counts as an import of it.
    """
    modules = list(modules)
    known = {m.name for m in modules}

    def ours(name: str) -> str | None:
        """The longest prefix of ``name`` that is a known module (or the root)."""
        while name:
            if name in known:
                return name
            name = name.rpartition(".")[0]
        return None

    edges = []
    for mod in modules:
        tree = ast.parse(mod.source, mod.path or mod.name)
        for node in ast.walk(tree):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = mod.package.split(".")
                    anchor = anchor[: len(anchor) - (node.level - 1)]
                    base = ".".join([*anchor, *([node.module] if node.module else [])])
                targets = [
                    f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names
                ]
            elif (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and _DOTTED.fullmatch(node.value)
            ):
                name = node.value.partition(":")[0]
                if ours(name) not in (None, "cardbus"):
                    targets = [name]
            for target in targets:
                line = getattr(node, "lineno", 0)
                if target == "cardbus":
                    edges.append(Edge(mod.name, "cardbus", line))
                elif target.startswith("cardbus.") and (hit := ours(target)) is not None:
                    edges.append(Edge(mod.name, hit, line))
    return edges


def layer_violations(modules: Iterable[Module], edges: Iterable[Edge]) -> list[str]:
    by_name = {m.name: m for m in modules}
    bad = []
    for e in edges:
        src, dst = layer_of(e.source), layer_of(e.target)
        if src == dst:
            continue
        if dst == "cardbus" or dst not in MAY_USE[src]:
            where = by_name[e.source].path or e.source
            bad.append(f"{where}:{e.line}: {src} imports {e.target} ({dst})")
    return sorted(bad)


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one node (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    top = stack.pop()
                    on_stack.discard(top)
                    component.append(top)
                    if top == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def package_cycles(modules: Iterable[Module], edges: Iterable[Edge]) -> list[list[str]]:
    """Cycles in the graph of packages (an ``__init__`` importing its own subtree is left out)."""
    by_name = {m.name: m for m in modules}
    graph: dict[str, set[str]] = {m.package: set() for m in by_name.values()}
    for e in edges:
        if e.target not in by_name:
            continue
        src, dst = by_name[e.source], by_name[e.target]
        if src.package == dst.package:
            continue
        if src.is_package and dst.name.startswith(src.name + "."):
            continue  # a package re-exporting what it contains
        graph[src.package].add(dst.package)
    return _cycles(graph)


def module_cycles_across_packages(
    modules: Iterable[Module], edges: Iterable[Edge]
) -> list[list[str]]:
    """Import cycles of modules that span more than one package."""
    by_name = {m.name: m for m in modules}
    graph: dict[str, set[str]] = {name: set() for name in by_name}
    for e in edges:
        if e.target in by_name:
            graph[e.source].add(e.target)
    return [c for c in _cycles(graph) if len({by_name[n].package for n in c}) > 1]


def bad_exceptions(module: types.ModuleType, root: type[BaseException]) -> list[str]:
    """Exception classes defined in ``module`` that break the error tree's rules."""
    listed = set(getattr(module, "__all__", ()))
    bad = []
    found: list[tuple[str, type]] = []
    for name, obj in vars(module).items():
        if isinstance(obj, type) and obj.__module__ == module.__name__:
            found.append((name, obj))
            found.extend(  # one level of nesting: exceptions kept as class attributes
                (f"{name}.{inner}", o)
                for inner, o in vars(obj).items()
                if isinstance(o, type) and o.__module__ == module.__name__
            )
    for name, cls in found:
        if not issubclass(cls, BaseException):
            continue
        private = any(part.startswith("_") for part in name.split("."))
        if private:
            if name in listed:
                bad.append(f"{module.__name__}.{name} is private but in __all__")
        elif not issubclass(cls, root) and (module.__name__, name) not in SIGNALS:
            bad.append(f"{module.__name__}.{name} does not derive from {root.__name__}")
    return sorted(bad)


# -- the real package --------------------------------------------------------------


@pytest.fixture(scope="module")
def code() -> tuple[list[Module], list[Edge]]:
    modules = modules_on_disk()
    return modules, imports(modules)


def test_there_is_code_to_check(code: tuple[list[Module], list[Edge]]) -> None:
    modules, edges = code
    assert {m.layer for m in modules} == set(LAYERS)
    assert len(modules) > 50 and len(edges) > 200


def test_imports_follow_the_layers(code: tuple[list[Module], list[Edge]]) -> None:
    assert layer_violations(*code) == []


def test_no_cycle_between_packages(code: tuple[list[Module], list[Edge]]) -> None:
    assert package_cycles(*code) == []
    assert module_cycles_across_packages(*code) == []


def _pyproject() -> dict:  # type: ignore[type-arg]
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def package_folders(root: Path) -> set[str]:
    """``cardbus.<dotted>`` of every folder with an ``__init__.py`` under the five folders."""
    return {
        "cardbus." + ".".join(init.parent.relative_to(root).parts)
        for layer in LAYERS
        for init in (root / layer).rglob("__init__.py")
    }


def test_package_folders_are_found(tmp_path: Path) -> None:
    for folder in ["bus", "bus/a2a", "eventstore/nats", "tools"]:
        (tmp_path / folder).mkdir(parents=True)
        (tmp_path / folder / "__init__.py").write_text("")
    (tmp_path / "bus" / "data").mkdir()  # no __init__.py: not a package
    assert package_folders(tmp_path) == {
        "cardbus.bus",
        "cardbus.bus.a2a",
        "cardbus.eventstore.nats",
        "cardbus.tools",
    }


def test_every_package_folder_is_listed_in_pyproject() -> None:
    setup = _pyproject()["tool"]["setuptools"]
    folders = package_folders(ROOT)
    listed = set(setup["packages"])
    assert folders - listed == set(), "package folders missing from pyproject's packages"
    assert sorted(listed) == sorted(set(listed)), "a package listed twice"
    # and every listed package is a folder with an __init__.py, under its package-dir
    dirs = setup["package-dir"]
    for package in listed:
        home = max((p for p in dirs if package == p or package.startswith(p + ".")), key=len)
        folder = ROOT / dirs[home] / Path(*package[len(home) :].split(".")[1:])
        assert (folder / "__init__.py").is_file(), f"{package}: no {folder}/__init__.py"
    assert {p.split(".")[0] for p in listed} == {"cardbus"}


def test_the_installed_distribution_has_only_cardbus_at_the_top() -> None:
    # the installed one (it has a RECORD), not a stale cardbus.egg-info on sys.path
    [dist] = [d for d in importlib.metadata.distributions(name="cardbus") if d.read_text("RECORD")]
    assert (dist.read_text("top_level.txt") or "").split() == ["cardbus"]
    top = set()
    for f in dist.files or ():
        first = f.parts[0]
        if first in ("..", f"cardbus-{dist.version}.dist-info", "__pycache__"):
            continue  # ../../../bin/cardbus, the metadata
        top.add(first)
    editable = {t for t in top if t.startswith("__editable__")}
    assert top - editable <= {"cardbus"}, top
    for finder in (t for t in editable if t.endswith(".py")):
        # an editable install maps import names to folders: all of them under cardbus
        mapping = importlib.import_module(finder.removesuffix(".py")).MAPPING
        assert all(name == "cardbus" or name.startswith("cardbus.") for name in mapping), mapping


def _setuptools_can_build() -> bool:
    if importlib.util.find_spec("setuptools") is None:
        return False
    import setuptools

    return int(setuptools.__version__.split(".")[0]) >= 77


@pytest.mark.skipif(
    not _setuptools_can_build(),
    reason="building offline needs setuptools>=77 in this venv (pip install 'setuptools>=77')",
)
def test_the_wheel_has_only_cardbus_at_the_top(tmp_path: Path) -> None:
    src = tmp_path / "src"
    shutil.copytree(  # build from a copy: a build writes build/ and *.egg-info
        ROOT,
        src,
        ignore=shutil.ignore_patterns(
            ".venv", ".git", ".*cache", ".hypothesis", ".typecheck", "__pycache__", "build"
        ),
    )
    env = {**os.environ, "PIP_NO_INDEX": "1"}
    cmd = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation"]
    subprocess.run([*cmd, "-w", str(tmp_path / "out"), str(src)], check=True, env=env)
    [wheel] = (tmp_path / "out").glob("cardbus-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert wheel_top_level_problems(names) == []
    assert "cardbus/__init__.py" in names and "cardbus/testing/__init__.py" in names


def wheel_top_level_problems(names: Iterable[str]) -> list[str]:
    return [n for n in names if not re.match(r"(cardbus/|cardbus-[^/]+\.dist-info/)", n)]


def all_modules() -> list[str]:
    """Every module of cardbus: each listed package and what it holds.

    (Walking ``cardbus.__path__`` alone misses ``cardbus.testing``, which lives in
    another folder.)
    """
    failed: list[str] = []
    names: set[str] = set()
    for package in _pyproject()["tool"]["setuptools"]["packages"]:
        names.add(package)
        path = importlib.import_module(package).__path__
        for info in pkgutil.walk_packages(path, package + ".", onerror=failed.append):
            names.add(info.name)
    assert failed == [], f"packages that do not import: {failed}"
    return sorted(n for n in names if n.rpartition(".")[2] != "__main__")  # that runs the CLI


def test_public_exceptions_derive_from_cardbus_error() -> None:
    from cardbus.eventstore.errors import CardbusError

    names = all_modules()
    assert {"cardbus.eventstore.errors", "cardbus.testing.bus", "cardbus.agents.agent"} <= set(
        names
    )
    bad: list[str] = []
    for name in names:
        bad.extend(bad_exceptions(importlib.import_module(name), CardbusError))
    assert bad == []
    # the exemptions are the signals the errors module documents
    doc = inspect.getdoc(importlib.import_module("cardbus.eventstore.errors")) or ""
    for module, name in SIGNALS:
        assert f"cardbus.agents.{name}" in doc
        assert not issubclass(getattr(importlib.import_module(module), name), CardbusError)


# -- the checkers catch what they should -------------------------------------------


def _mods(**sources: str) -> list[Module]:
    """``_mods(**{"eventstore.store": "import x"})``; a key ending in ``.__init__`` is a package."""
    out = []
    for key, src in sources.items():
        is_package = key.endswith(".__init__")
        name = "cardbus." + key.removesuffix(".__init__")
        out.append(Module(name, is_package, src))
    return out


def test_checker_finds_an_import_against_the_layers() -> None:
    mods = _mods(
        **{
            "eventstore.__init__": "",
            "eventstore.store": "def f():\n    from cardbus.bus.orchestrator import core\n",
            "eventstore.rel": "from ..projections import tasks\n",
            "eventstore.api": "import cardbus\n",
            "agents.__init__": "",
            "agents.x": "from cardbus.projections.tasks import TaskTable\n",
            "projections.__init__": "",
            "projections.tasks": "from cardbus.eventstore.store import EventStore\n",
            "projections.lazy": "HOME = 'cardbus.agents.x:Thing'\n",
            "bus.__init__": "",
            "bus.orchestrator.__init__": "",
            "bus.orchestrator.core": "from cardbus.tools import cli\n",
            "tools.__init__": "",
            "tools.cli": "from cardbus.bus.orchestrator import core\n",
        }
    )
    assert layer_violations(mods, imports(mods)) == [
        "cardbus.agents.x:1: agents imports cardbus.projections.tasks (projections)",
        "cardbus.bus.orchestrator.core:1: bus imports cardbus.tools.cli (tools)",
        "cardbus.eventstore.api:1: eventstore imports cardbus (cardbus)",
        "cardbus.eventstore.rel:1: eventstore imports cardbus.projections.tasks (projections)",
        "cardbus.eventstore.store:2: eventstore imports cardbus.bus.orchestrator.core (bus)",
        "cardbus.projections.lazy:1: projections imports cardbus.agents.x (agents)",
    ]


def test_checker_resolves_imports() -> None:
    mods = _mods(
        **{
            "bus.__init__": "from .orchestrator import core\nfrom . import telemetry\n",
            "bus.telemetry": "SUBJECT = 'cardbus.agent.a'\n",  # a NATS subject, no module
            "bus.orchestrator.__init__": "",
            "bus.orchestrator.core": "from ..telemetry import span\nimport cardbus.bus.telemetry\n",
        }
    )
    got = sorted((e.source, e.target) for e in imports(mods))
    assert got == [
        ("cardbus.bus", "cardbus.bus.orchestrator.core"),
        ("cardbus.bus", "cardbus.bus.telemetry"),
        ("cardbus.bus.orchestrator.core", "cardbus.bus.telemetry"),
        ("cardbus.bus.orchestrator.core", "cardbus.bus.telemetry"),
    ]
    # the facade re-exporting its subpackage is no cycle with the subpackage using telemetry
    assert package_cycles(mods, imports(mods)) == []
    assert module_cycles_across_packages(mods, imports(mods)) == []


def test_checker_finds_cycles_between_packages() -> None:
    mods = _mods(
        **{
            "bus.transport.__init__": "",
            "bus.transport.a": "from cardbus.bus.orchestrator.b import x\n",
            "bus.orchestrator.__init__": "",
            "bus.orchestrator.b": "X = 1\n",
            "bus.orchestrator.c": "from cardbus.bus.transport import a\n",
            "tools.__init__": "",
            "tools.one": "from cardbus.tools import two\n",  # within a package: allowed
            "tools.two": "from cardbus.tools import one\n",
        }
    )
    edges = imports(mods)
    assert package_cycles(mods, edges) == [["cardbus.bus.orchestrator", "cardbus.bus.transport"]]
    assert module_cycles_across_packages(mods, edges) == []  # no module cycle, a package one
    # b now imports a back: a module cycle across the two packages
    looped = [
        Module(m.name, False, "import cardbus.bus.transport.a\n") if m.name.endswith(".b") else m
        for m in mods
    ]
    assert module_cycles_across_packages(looped, imports(looped)) == [
        ["cardbus.bus.orchestrator.b", "cardbus.bus.transport.a"]
    ]


def test_checker_finds_bad_exceptions() -> None:
    class Root(Exception):
        pass

    mod = types.ModuleType("cardbus.fake")
    for name, base in [("Good", Root), ("Stray", Exception), ("_Quiet", Exception)]:
        mod.__dict__[name] = type(name, (base,), {"__module__": "cardbus.fake"})
    mod.__dict__["Holder"] = type(
        "Holder",
        (),
        {
            "__module__": "cardbus.fake",
            "Inner": type("Inner", (ValueError,), {"__module__": "cardbus.fake"}),
        },
    )
    mod.__dict__["__all__"] = ["Good", "Stray", "_Quiet"]
    mod.__dict__["Imported"] = KeyError  # not defined here: not this module's business
    assert bad_exceptions(mod, Root) == [
        "cardbus.fake.Holder.Inner does not derive from Root",
        "cardbus.fake.Stray does not derive from Root",
        "cardbus.fake._Quiet is private but in __all__",
    ]


def test_wheel_checker_finds_a_stray_top_level() -> None:
    ok = ["cardbus/__init__.py", "cardbus/bus/__init__.py", "cardbus-0.1.0.dist-info/RECORD"]
    assert wheel_top_level_problems(ok) == []
    assert wheel_top_level_problems([*ok, "agents/__init__.py", "tests/conftest.py"]) == [
        "agents/__init__.py",
        "tests/conftest.py",
    ]

"""``import cardbus`` is the curated public API, chosen on purpose: this pins it.

(Named test_cardbus_api.py: test module basenames must be unique, and
tests/projections/test_public_api.py pins ``cardbus.projections``.)
"""

from __future__ import annotations

import ast
import contextlib
import importlib
import importlib.util
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import cardbus

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"

EXPECTED = {
    "AccessDenied",
    "Agent",
    "AgentCard",
    "AgentConstraints",
    "AskPerson",
    "AmbiguousId",
    "AsOf",
    "BusError",
    "Capability",
    "CapabilitySpec",
    "CardbusError",
    "Completion",
    "ConcurrencyError",
    "ConfigError",
    "DecodeError",
    "EffectUnknown",
    "EmbeddedRuntime",
    "EventStore",
    "IdempotencyError",
    "IllegalTransition",
    "InvalidPlan",
    "PlanConflict",
    "LLM",
    "LLMAgent",
    "LLMBadOutput",
    "LLMError",
    "LLMLimitExceeded",
    "LLMMaxToolCalls",
    "LLMMaxTurns",
    "LLMPlanner",
    "LLMRateLimited",
    "LLMRequestRefused",
    "LLMServerError",
    "LLMTimeout",
    "LLMTokenLimit",
    "MemoryEventStore",
    "MockLLM",
    "NatsEventStore",
    "NatsRuntime",
    "NeedsInput",
    "NotStarted",
    "OpenAIChatLLM",
    "Orchestrator",
    "PayloadTooLarge",
    "Plan",
    "PlanTask",
    "Policy",
    "PrerequisiteNotStored",
    "Reject",
    "RemoteA2AAgent",
    "ResultCard",
    "RetryPolicy",
    "Review",
    "ReviewIssue",
    "RulePlanner",
    "RunResult",
    "SqliteEventStore",
    "StoreError",
    "StoreClosed",
    "StoreUnavailable",
    "StreamNotFound",
    "SubjectLayoutError",
    "TaskCard",
    "TaskContext",
    "Timeline",
    "Tool",
    "ToolError",
    "ToolFailed",
    "ToolInputInvalid",
    "ToolNotFound",
    "ToolRegistry",
    "ToolResultTooLarge",
    "ToolTimeout",
    "UnknownEventType",
    "ValidationError",
    "Weights",
    "decode_plan",
    "open_store",
    "replay",
    "validate_plan",
}


def test_all_is_pinned() -> None:
    assert set(cardbus.__all__) == EXPECTED
    assert len(cardbus.__all__) == len(EXPECTED), "a name listed twice"


def test_every_name_resolves_to_the_object_of_that_name() -> None:
    for name in sorted(EXPECTED):
        value = getattr(cardbus, name)
        assert getattr(value, "__name__", name) == name, (name, value)
        home = importlib.import_module(value.__module__)
        assert getattr(home, name) is value
    assert set(dir(cardbus)) >= EXPECTED
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        cardbus.Nope  # noqa: B018


def test_the_type_checkers_view_is_the_same_list() -> None:
    """The ``if TYPE_CHECKING:`` imports (what mypy sees) name exactly ``__all__``."""
    tree = ast.parse((ROOT / "__init__.py").read_text(encoding="utf-8"))
    [block] = [
        n for n in tree.body if isinstance(n, ast.If) and ast.unparse(n.test) == "TYPE_CHECKING"
    ]
    seen = [
        a.asname or a.name for n in block.body if isinstance(n, ast.ImportFrom) for a in n.names
    ]
    assert sorted(seen) == sorted(EXPECTED)


def _imported_after(code: str, tmp_path: Path) -> set[str]:
    """The modules of cardbus and nats a fresh interpreter holds after ``code``."""
    probe = (
        f"{code}\nimport sys\n"
        "print(' '.join(m for m in sys.modules if m.startswith(('cardbus', 'nats'))))"
    )
    # a clean cwd: the repository root holds folders named agents, bus, ...
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True, check=True
    )
    return set(out.stdout.split())


def _heavy(modules: set[str]) -> set[str]:
    return {m for m in modules if m.startswith("cardbus.bus") or m.split(".")[0] == "nats"}


def test_import_cardbus_is_lazy(tmp_path: Path) -> None:
    assert _imported_after("import cardbus", tmp_path) == {"cardbus"}
    # the log and its errors come without the bus or nats-py
    assert _heavy(_imported_after("import cardbus\ncardbus.MemoryEventStore", tmp_path)) == set()
    # ... and a name from the bus does load it (so the probe can see it)
    assert "cardbus.bus" in _heavy(_imported_after("import cardbus\ncardbus.Policy", tmp_path))


# -- the README's examples use the public API -------------------------------------


def _is_package(name: str) -> bool:
    try:
        spec = importlib.util.find_spec(name)
    except ImportError:  # a parent that is no package (`cardbus.db.proj` is a file name)
        return False
    return spec is not None and spec.submodule_search_locations is not None


def readme_import_problems(text: str, documented_only: bool = True) -> list[str]:
    """Imports in the ``python`` blocks of a page (README or docs) that reach past the
    documented API.

    ``cardbus`` itself (names from ``__all__``) and the subpackages the page
    names in backticks (``cardbus.projections``) are the documented API; other
    imports must be the standard library, something installed, or a module the
    page itself writes (a block titled ``my_agents.py``). ``documented_only`` False
    (the docs site, whose reference documents every module): a ``cardbus.*`` module
    need not be named on the page, but must exist and hold the names imported.
    """
    prose = re.sub(r"```.*?```", "", text, flags=re.S)
    documented = {n for n in re.findall(r"`(cardbus(?:\.\w+)+)`", prose) if _is_package(n)}
    local = {Path(t).stem for t in re.findall(r"```python[^\n]*title=\"([^\"]+\.py)\"", text)}
    problems = []
    for i, block in enumerate(re.findall(r"^```python[^\n]*\n(.*?)^```", text, re.S | re.M)):
        for node in ast.walk(ast.parse(block)):
            if isinstance(node, ast.Import):
                found = [(a.name, None) for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                found = [(node.module, a.name) for a in node.names]
            else:
                continue
            for module, name in found:
                where = f"python block {i + 1}, line {node.lineno}: {module}"
                if module.split(".")[0] in local:
                    continue
                if module.split(".")[0] != "cardbus":
                    if module.split(".")[0] not in sys.stdlib_module_names and (
                        importlib.util.find_spec(module.split(".")[0]) is None
                    ):
                        problems.append(f"{where}: not installed")
                elif module == "cardbus":
                    if name is not None and name not in cardbus.__all__:
                        problems.append(f"{where}: {name} is not in cardbus.__all__")
                elif module not in documented and documented_only:
                    problems.append(f"{where}: not a documented subpackage")
                elif importlib.util.find_spec(module) is None:
                    problems.append(f"{where}: no such module")
                elif name is not None and not hasattr(importlib.import_module(module), name):
                    problems.append(f"{where}: has no {name}")
    return problems


DOCS = sorted(p for p in (ROOT / "docs").rglob("*.md") if "_hooks" not in p.parts)


@contextlib.contextmanager
def _as_a_reader() -> Iterator[None]:
    """sys.path as a reader's interpreter has it: the repository's root (which pytest may
    have put first) last, where its folder agents/ does not shadow openai-agents'
    `agents` (the framework adapters import it when their names are looked up)."""
    saved = list(sys.path)
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT] + [str(ROOT)]
    try:
        yield
    finally:
        sys.path[:] = saved


def test_readme_examples_import_only_the_documented_api() -> None:
    text = README.read_text(encoding="utf-8")
    assert text.count("```python") >= 1
    with _as_a_reader():
        assert readme_import_problems(text) == []


@pytest.mark.parametrize("page", DOCS, ids=lambda p: str(p.relative_to(ROOT / "docs")))
def test_docs_examples_import_only_the_documented_api(page: Path) -> None:
    """Every name the docs import from ``cardbus`` is exported (``ReviewIssue`` included),
    and every module they import from exists and holds the names."""
    with _as_a_reader():
        assert readme_import_problems(page.read_text(encoding="utf-8"), False) == []


def test_the_tutorials_import_from_cardbus_itself() -> None:
    imported = {
        name.strip()
        for page in DOCS
        for names in re.findall(r"^from cardbus import ([^(\n]+)$", page.read_text(), re.M)
        for name in names.split(",")
    }
    assert {"ReviewIssue", "Review", "Reject", "LLMAgent", "Tool", "ToolRegistry"} <= imported


def test_readme_checker_catches_a_private_import() -> None:
    text = (
        "The folds are in `cardbus.projections`; see `cardbus.projections.tasks`.\n"
        "```python\n"
        "import msgspec\n"
        "from cardbus import Agent, Secret\n"
        "from cardbus.projections import TaskTable, Nothing\n"
        "from cardbus.projections.tasks import TaskTable\n"  # a module, not a package
        "from cardbus.bus.orchestrator.core import Orchestrator\n"
        "import not_a_module_anyone_installed\n"
        "```\n"
    )
    assert readme_import_problems(text) == [
        "python block 1, line 2: cardbus: Secret is not in cardbus.__all__",
        "python block 1, line 3: cardbus.projections: has no Nothing",
        "python block 1, line 4: cardbus.projections.tasks: not a documented subpackage",
        "python block 1, line 5: cardbus.bus.orchestrator.core: not a documented subpackage",
        "python block 1, line 6: not_a_module_anyone_installed: not installed",
    ]

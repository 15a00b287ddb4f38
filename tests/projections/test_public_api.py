"""The public API of ``projections`` is chosen on purpose: this pins it."""

from __future__ import annotations

import ast
from pathlib import Path

import cardbus.projections as projections

EXPECTED = {
    "AgentStat",
    "AgentStats",
    "AgentStatsFold",
    "AsOf",
    "AttemptSpan",
    "Cost",
    "EffectUnknown",
    "ForkPlan",
    "LoopCounter",
    "LoopHashes",
    "MemoryTable",
    "Model",
    "ModelCall",
    "Projection",
    "ProjectionError",
    "ProjectionRunner",
    "Quality",
    "RUN_STATUSES",
    "Runs",
    "SqliteTable",
    "Step",
    "TableSpec",
    "TaskNode",
    "TaskTable",
    "Timeline",
    "ToolCall",
    "all_projections",
    "build_as_of",
    "build_timeline",
    "dump_tables",
    "event_reason",
    "fork_task_id",
    "journal_calls",
    "parse_since",
    "percentile",
    "plan_fork",
    "projection_path",
    "render_html",
    "replay",
    "resolve_id",
    "run_duration",
}


def test_public_api_is_pinned() -> None:
    assert set(projections.__all__) == EXPECTED
    for name in EXPECTED:
        assert getattr(projections, name) is not None


def test_projection_modules_import_only_eventstore() -> None:
    """projections depends on eventstore and nothing else of ours (DESIGN.md)."""
    ours = {"bus", "agents", "tools"}
    for module in sorted((Path(projections.__file__).parent).glob("*.py")):
        tree = ast.parse(module.read_text())
        for node in ast.walk(tree):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            for n in names:
                assert n.split(".")[0] not in ours, f"{module.name} imports {n}"

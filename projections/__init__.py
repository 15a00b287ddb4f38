"""Projections: pure folds over the event log, kept current by a runner.

Public API::

    runner = ProjectionRunner.open(store, projection_path("cardbus.db"))  # or ":memory:"
    await runner.catch_up()                 # or: asyncio.create_task(runner.follow())
    TaskTable().list(runner.conn, status="failed")
    LoopHashes().count(runner.conn, root_id, loop_hash)
    AgentStats().get(runner.conn, agent_id, capability) -> AgentStat
    Cost().list(runner.conn, "root"); Quality().list(runner.conn)
    Runs().list(runner.conn, status="running", since=parse_since("1d"), limit=20)
    root_id = await resolve_id(store, "01a2b3c4")   # a unique prefix or a plan id
    await runner.rebuild(["tasks"])

    # without SQLite (the orchestrator folds the log itself):
    stats = AgentStatsFold(); loops = LoopCounter()
    for env in events: stats.apply(env); loops.apply(env)
    stats.get(agent_id, capability); loops.count(root_id, loop_hash)

    # time travel and replay
    old = await build_as_of(store, AsOf.parse("2026-11-29T23:00:00Z"))
    timeline = await replay(store, task_or_root_id, as_of=AsOf(position=120))
"""

from __future__ import annotations

from cardbus.projections.agent_stats import AgentStat, AgentStats, AgentStatsFold, percentile
from cardbus.projections.base import Projection
from cardbus.projections.cost import Cost
from cardbus.projections.fork import ForkPlan, fork_task_id, plan_fork
from cardbus.projections.ids import resolve_id
from cardbus.projections.loops import LoopCounter, LoopHashes
from cardbus.projections.model import MemoryTable, Model, SqliteTable, TableSpec
from cardbus.projections.quality import Quality
from cardbus.projections.replay import (
    AttemptSpan,
    EffectUnknown,
    ModelCall,
    Step,
    TaskNode,
    Timeline,
    ToolCall,
    build_timeline,
    journal_calls,
    replay,
)
from cardbus.projections.replay_html import render_html
from cardbus.projections.runner import (
    ProjectionError,
    ProjectionRunner,
    dump_tables,
    projection_path,
)
from cardbus.projections.runs import RUN_STATUSES, Runs, parse_since, run_duration
from cardbus.projections.tasks import TaskTable, event_reason
from cardbus.projections.timetravel import AsOf, build_as_of

__all__ = [
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
]


def all_projections() -> list[Projection]:
    """One instance of every built-in projection, in a stable order."""
    return [TaskTable(), LoopHashes(), AgentStats(), Cost(), Quality(), Runs()]

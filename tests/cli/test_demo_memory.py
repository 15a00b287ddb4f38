"""The demo with memory: what the writer sees, and a preference remembered across runs."""

from __future__ import annotations

import hashlib
from pathlib import Path

import msgspec
from click.testing import CliRunner

from cardbus.agents.cards import TaskCard
from cardbus.agents.demo import Merger, Planner, Researcher, Reviewer, Writer, report_plan
from cardbus.bus.runtime.embedded import EmbeddedRuntime
from cardbus.eventstore import SqliteEventStore
from cardbus.eventstore import events as ev
from cardbus.projections import replay
from cardbus.tools.cli import cli


class RecordingWriter(Writer):
    """The demo writer, keeping every card it is handed."""

    cards: list[TaskCard] = []

    async def handle(self, task, inputs, ctx):  # type: ignore[no-untyped-def]
        type(self).cards.append(task)
        return await super().handle(task, inputs, ctx)


AGENTS = [Researcher, Planner, RecordingWriter, Reviewer, Merger]


async def test_writer_sees_only_its_dependencies_and_the_second_run_remembers(
    tmp_path: Path,
) -> None:
    RecordingWriter.cards = []
    store = await SqliteEventStore.open(tmp_path / "cardbus.db", poll_interval=0.01)
    try:
        async with EmbeddedRuntime(store, AGENTS) as rt:
            first = await rt.run(report_plan("ocean tides"), timeout=30)
            assert first.status == "completed", first
            # the session asked for markdown; the policy kept it once the run succeeded
            pref = await rt.memory.get("pref/demo/report_format")
            assert pref is not None and pref.value == "markdown" and pref.root_id == first.root_id
            second = await rt.run(report_plan("ocean tides", preferences={}), timeout=30)
            assert second.status == "completed", second
        # -- exactly what the writer received in the first run ----------------------
        state = rt.orchestrator.state
        names = state.runs[first.root_id].names
        card = RecordingWriter.cards[0]
        assert card.task_id == names["draft"]
        assert card.deps == [names["outline"], names["research"]]
        outline = state.tasks[names["outline"]].output
        research = state.tasks[names["research"]].output
        assert card.inputs == {
            "topic": "ocean tides",
            "outline": outline["sections"],
            "facts": research["facts"],
            "figures": outline["figures"],  # the supplementary research, through the outline
            "user": "demo",
        }
        assert card.supplement is None and card.review == []
        # nothing of the session (request, preferences) and nothing of other tasks
        seen = msgspec.json.encode(card).decode()
        assert "preferences" not in seen and "a short report" not in seen
        assert not [f for f in card.inputs["facts"] if "figures fact" in f]  # the planner's extra
        dispatched = next(
            e.data
            for e in await store.read_stream(card.task_id)
            if isinstance(e.data, ev.TaskDispatched)
        )
        digest = hashlib.sha256(msgspec.json.encode(card.inputs, order="sorted")).hexdigest()
        assert dispatched.inputs_digest == digest  # the log says the same
        # -- the preference: unknown in run 1, read from long-term memory in run 2 --
        assert first.outputs["draft"]["format"] == "plain"
        assert second.outputs["draft"]["format"] == "markdown"
        assert second.outputs["draft"]["sections"][0]["text"].startswith("- ")
        draft2 = state.runs[second.root_id].names["draft"]
        reads = [
            e.data for e in await store.read_stream(draft2) if isinstance(e.data, ev.MemoryRead)
        ]
        assert reads and reads[0].mode == "get"
        assert reads[0].keys == ["pref/demo/report_format"] and reads[0].agent_id == "writer"
        # -- the replay shows the tool calls and memory reads --------------------------
        timeline = await replay(store, second.root_id)
        kinds = {s.kind for _, n in timeline.walk() for s in n.steps}
        assert {"tool.called", "memory.read"} <= kinds
        research2 = state.runs[second.root_id].names["research"]
        calls = [
            e.data for e in await store.read_stream(research2) if isinstance(e.data, ev.ToolCalled)
        ]
        assert calls and calls[0].tool == "doc_search" and calls[0].error is None
    finally:
        await store.close()


def test_cardbus_demo_twice_remembers_the_format(tmp_path: Path) -> None:
    db = str(tmp_path / "demo.db")
    runner = CliRunner()
    first = runner.invoke(cli, ["demo", "--db", db])
    assert first.exit_code == 0, first.output
    second = runner.invoke(cli, ["demo", "--db", db])
    assert second.exit_code == 0, second.output
    assert "- ocean tides" in second.output  # the markdown bullets of the preferred format
    # the second run's timeline (the demo sums it up; replay draws every event)
    root = second.stdout.splitlines()[0].split()[1].rstrip(":")
    timeline = runner.invoke(cli, ["replay", root, "--db", db])
    assert timeline.exit_code == 0, timeline.output
    assert "tool.called" in timeline.output and "memory.read" in timeline.output
    out = runner.invoke(cli, ["memory", "list", "--db", db, "--kind", "preference"])
    assert "pref/demo/report_format" in out.output and "markdown" in out.output


async def test_settle_decides_from_what_it_observed_and_reads_only_runs_it_did_not(
    tmp_path: Path,
) -> None:
    store = await SqliteEventStore.open(tmp_path / "cardbus.db", poll_interval=0.01)
    reads: list[str] = []
    real_read = store.read_correlation

    async def counting_read(root_id: str):  # type: ignore[no-untyped-def]
        reads.append(root_id)
        return await real_read(root_id)

    store.read_correlation = counting_read  # type: ignore[method-assign]
    try:
        async with EmbeddedRuntime(store, AGENTS) as rt:
            run = await rt.run(report_plan("ocean tides"), timeout=30)
            assert run.status == "completed"
            assert reads == []  # the keeper saw the run happen: nothing read back
            pref = await rt.memory.get("pref/demo/report_format")
            assert pref is not None and pref.root_id == run.root_id
        # a keeper that did not see the run (a restart) reads it, and writes nothing twice
        from cardbus.bus.orchestrator.memory import MEMORY_STREAM, MemoryKeeper

        stored = await store.read_stream(MEMORY_STREAM)
        again = await MemoryKeeper(store).settle(run.root_id)
        assert reads == [run.root_id]
        assert again == stored  # the same events, returned as stored: none written twice
        assert await store.read_stream(MEMORY_STREAM) == stored
    finally:
        await store.close()

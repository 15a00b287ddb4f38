"""The task state machine, exhaustively: every state (and None) x every event type.

Also pins the README: its state table and A2A table are generated from
``eventstore.states`` by ``render_transition_table`` / ``render_a2a_table``
below, and the event catalogue lists every tag. Print the tables with
``.venv/bin/python tests/test_states.py``.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import msgspec
import pytest

from cardbus.eventstore import IllegalTransition, TaskState, fold_state, transition
from cardbus.eventstore import events as ev
from cardbus.eventstore.events import EVENT_TYPES, TASK_EVENT_TYPES, tag_of
from cardbus.eventstore.states import A2A_STATE, TERMINAL, TRANSITIONS

README = Path(__file__).resolve().parents[2] / "README.md"
STATES: list[TaskState | None] = [None, *TaskState]
A2A_STATES = {  # a2a-sdk's TaskState names (A2A v1.0), but TASK_STATE_UNSPECIFIED
    "TASK_STATE_SUBMITTED",
    "TASK_STATE_WORKING",
    "TASK_STATE_INPUT_REQUIRED",
    "TASK_STATE_COMPLETED",
    "TASK_STATE_CANCELED",
    "TASK_STATE_FAILED",
    "TASK_STATE_REJECTED",
    "TASK_STATE_AUTH_REQUIRED",
}
_A2A_TERMINAL = {
    "TASK_STATE_COMPLETED",
    "TASK_STATE_CANCELED",
    "TASK_STATE_FAILED",
    "TASK_STATE_REJECTED",
}
RESUMABLE = (TaskState.PENDING, TaskState.RUNNING)  # where ApprovalGranted may send a task


def _value_for(t: msgspec.inspect.Type) -> Any:
    """A valid value for a required field of type ``t``."""
    match t:
        case msgspec.inspect.StrType():
            return "x"
        case msgspec.inspect.BoolType():
            return False
        case msgspec.inspect.IntType():
            return 1
        case msgspec.inspect.FloatType():
            return 1.0
        case msgspec.inspect.DictType():
            return {}
        case msgspec.inspect.ListType():
            return []
        case msgspec.inspect.UnionType(types=types):
            return _value_for(types[0])
        case msgspec.inspect.StructType(cls=cls):
            return sample(cls)
        case _:
            return None


def sample(cls: type) -> Any:
    """An instance of any event (or nested struct) type, its required fields filled in."""
    info = msgspec.inspect.type_info(cls)
    assert isinstance(info, msgspec.inspect.StructType)
    fields = {f.name: _value_for(f.type) for f in info.fields if f.required}
    return cls(**fields)


TASK_EVENTS = [sample(t) for t in TASK_EVENT_TYPES]
OTHER_EVENTS = [sample(t) for t in EVENT_TYPES if t not in TASK_EVENT_TYPES]


def _id(x: object) -> str:
    return tag_of(type(x)) if hasattr(type(x), "__struct_config__") else str(x)


@pytest.mark.parametrize("state", STATES, ids=str)
@pytest.mark.parametrize("event", TASK_EVENTS, ids=_id)
def test_every_state_times_every_task_event(state: TaskState | None, event: Any) -> None:
    tag = tag_of(type(event))
    if isinstance(event, ev.ApprovalGranted):
        allowed = {TaskState.AWAITING_APPROVAL: TaskState(event.resume)}
    else:
        assert type(event) in TRANSITIONS, f"{tag} has no row in TRANSITIONS"
        allowed = TRANSITIONS[type(event)]
    if state in allowed:
        assert transition(state, event) is allowed[state]
    else:
        with pytest.raises(IllegalTransition) as info:
            transition(state, event)
        assert info.value.state == str(state)
        assert tag in info.value.event_type
        assert str(state) in str(info.value)
        assert tag in str(info.value)


@pytest.mark.parametrize("state", STATES, ids=str)
@pytest.mark.parametrize("event", OTHER_EVENTS, ids=_id)
def test_non_task_events_are_refused(state: TaskState | None, event: Any) -> None:
    with pytest.raises(IllegalTransition) as info:
        transition(state, event)
    assert tag_of(type(event)) in str(info.value)
    assert str(state) in str(info.value)


@pytest.mark.parametrize("thing", [None, "task.created.v1", {"type": "task.created.v1"}, 42])
def test_things_that_are_not_events_are_refused(thing: object) -> None:
    with pytest.raises(IllegalTransition):
        transition(TaskState.PENDING, thing)


def test_every_task_event_type_has_a_row() -> None:
    covered = set(TRANSITIONS) | {ev.ApprovalGranted}
    assert set(TASK_EVENT_TYPES) == covered
    assert all(t in TASK_EVENT_TYPES for t in TRANSITIONS)


def test_only_task_created_starts_a_task() -> None:
    starters = [t for t, moves in TRANSITIONS.items() if None in moves]
    assert starters == [ev.TaskCreated]
    assert TRANSITIONS[ev.TaskCreated] == {None: TaskState.PENDING}


@pytest.mark.parametrize("state", sorted(TERMINAL), ids=str)
def test_terminal_states_are_absorbing(state: TaskState) -> None:
    for event in TASK_EVENTS:
        try:
            after = transition(state, event)
        except IllegalTransition:
            continue
        assert after is state, f"{tag_of(type(event))} leaves terminal {state}"


@pytest.mark.parametrize("resume", RESUMABLE, ids=str)
def test_approval_granted_resumes_where_it_says(resume: TaskState) -> None:
    granted = ev.ApprovalGranted(by="alice", resume=str(resume))
    assert transition(TaskState.AWAITING_APPROVAL, granted) is resume


def test_approval_granted_defaults_to_pending() -> None:
    assert transition(TaskState.AWAITING_APPROVAL, ev.ApprovalGranted(by="bob")) is (
        TaskState.PENDING
    )


@pytest.mark.parametrize(
    "resume", [s.value for s in TaskState if s not in RESUMABLE] + ["", "nonsense", "PENDING"]
)
def test_approval_granted_refuses_other_resume_states(resume: str) -> None:
    with pytest.raises(IllegalTransition) as info:
        transition(TaskState.AWAITING_APPROVAL, ev.ApprovalGranted(by="a", resume=resume))
    assert "task.approval_granted.v1" in str(info.value)
    assert repr(resume) in str(info.value)
    assert "awaiting_approval" in str(info.value)


@pytest.mark.parametrize("state", [s for s in STATES if s is not TaskState.AWAITING_APPROVAL])
def test_approval_granted_outside_awaiting_approval(state: TaskState | None) -> None:
    with pytest.raises(IllegalTransition) as info:
        transition(state, ev.ApprovalGranted(by="a"))
    assert info.value.state == str(state)


def test_transition_is_pure() -> None:
    event = ev.TaskStarted(attempt=1, agent_id="a")
    before = {t: dict(m) for t, m in TRANSITIONS.items()}
    for _ in range(3):
        assert transition(TaskState.DISPATCHED, event) is TaskState.RUNNING
    assert before == TRANSITIONS


# -- A2A ----------------------------------------------------------------------


@pytest.mark.parametrize("state", list(TaskState), ids=str)
def test_every_state_has_an_a2a_state(state: TaskState) -> None:
    assert A2A_STATE[state] in A2A_STATES


def test_terminal_states_map_to_terminal_a2a_states() -> None:
    for state in TERMINAL:
        assert A2A_STATE[state] in _A2A_TERMINAL
    for state in set(TaskState) - TERMINAL:
        assert A2A_STATE[state] not in _A2A_TERMINAL


def test_a2a_states_are_a2a_sdk_task_states() -> None:
    from a2a.types import TaskState as A2ATaskState

    assert set(A2A_STATES) == set(A2ATaskState.keys()) - {"TASK_STATE_UNSPECIFIED"}


def test_waiting_for_approval_is_not_auth_required() -> None:
    # A2A reserves auth-required for authentication; an approval is input from a human
    assert A2A_STATE[TaskState.AWAITING_APPROVAL] == "TASK_STATE_INPUT_REQUIRED"


# -- whole lifecycles -----------------------------------------------------------


def test_happy_path() -> None:
    events = [
        ev.TaskCreated(root_id="r", capability="c"),
        ev.TaskDispatched(attempt=1, agent_id="a"),
        ev.TaskStarted(attempt=1, agent_id="a"),
        ev.TaskResultSubmitted(attempt=1, agent_id="a", status="completed"),
        ev.TaskCompleted(attempt=1, agent_id="a"),
    ]
    assert fold_state(events) is TaskState.COMPLETED
    assert fold_state([*events, ev.TaskResultIgnored(attempt=1, agent_id="a", reason="dup")]) is (
        TaskState.COMPLETED
    )


def test_rejection_and_timeout_return_to_pending_then_retry() -> None:
    events: list[object] = [
        ev.TaskCreated(root_id="r", capability="c"),
        ev.TaskDispatched(attempt=1, agent_id="a"),
        ev.TaskRejected(attempt=1, agent_id="a", reason="out_of_capability"),
        ev.TaskDispatched(attempt=1, agent_id="b"),
        ev.TaskStarted(attempt=1, agent_id="b"),
        ev.TaskTimedOut(attempt=1, agent_id="b", deadline=1.0),
        ev.TaskRetryScheduled(attempt=2, delay_s=0.1, reason="timeout"),
        ev.TaskDispatched(attempt=2, agent_id="b"),
    ]
    assert fold_state(events[:3]) is TaskState.PENDING
    assert fold_state(events[:6]) is TaskState.PENDING
    assert fold_state(events) is TaskState.DISPATCHED
    assert fold_state([*events, ev.TaskFailed(reason="budget spent")]) is TaskState.FAILED


def test_review_input_and_approval_paths() -> None:
    base: list[object] = [
        ev.TaskCreated(root_id="r", capability="c"),
        ev.TaskDispatched(attempt=1, agent_id="a"),
    ]
    revised = [
        *base,
        ev.RevisionRequested(round=1, reviewer_task_id="rev"),
        ev.TaskDispatched(attempt=2, agent_id="a"),
    ]
    assert fold_state(revised) is TaskState.DISPATCHED
    needs = [*base, ev.TaskNeedsInput(attempt=1, agent_id="a", missing="k")]
    assert fold_state(needs) is TaskState.NEEDS_INPUT
    assert fold_state([*needs, ev.InputProvided(supplementary_task_id="s")]) is TaskState.PENDING
    approval = [
        *base,
        ev.TaskStarted(attempt=1, agent_id="a"),
        ev.ApprovalRequested(reason="spend"),
    ]
    assert fold_state(approval) is TaskState.AWAITING_APPROVAL
    assert fold_state([*approval, ev.ApprovalDenied(by="x")]) is TaskState.CANCELLED
    granted = [*approval, ev.ApprovalGranted(by="x", resume="running")]
    assert fold_state(granted) is TaskState.RUNNING


def test_fold_refuses_a_stream_that_does_not_start_with_created() -> None:
    with pytest.raises(IllegalTransition) as info:
        fold_state([ev.TaskStarted(attempt=1, agent_id="a")])
    assert "None" in str(info.value)
    assert "task.started.v1" in str(info.value)


def test_fold_of_nothing_is_none() -> None:
    assert fold_state([]) is None


# -- the README tables ----------------------------------------------------------


def _state_name(state: TaskState | None) -> str:
    return "(new)" if state is None else state.value


def render_transition_table() -> str:
    """The README's state table, generated from ``TRANSITIONS``."""
    lines = ["| event | from state → to state |", "|---|---|"]
    for event_type, moves in TRANSITIONS.items():
        if set(moves) == set(TaskState) and all(frm is to for frm, to in moves.items()):
            lines.append(f"| `{tag_of(event_type)}` | any state → the same state (no move) |")
            continue
        by_target: dict[TaskState, list[str]] = {}
        for frm, to in moves.items():
            by_target.setdefault(to, []).append(_state_name(frm))
        cells = []
        for to, froms in by_target.items():
            if set(froms) == {_state_name(s) for s in STATES if s is not None} and len(froms) > 1:
                cells.append(f"any state → {to.value}")
            elif frozenset(froms) == {_state_name(s) for s in set(TaskState) - TERMINAL}:
                cells.append(f"any live state → {to.value}")
            elif froms == [to.value] and len(moves) > 1:
                cells.append(f"{to.value} → {to.value}")
            else:
                cells.append(f"{', '.join(froms)} → {to.value}")
        lines.append(f"| `{tag_of(event_type)}` | {'; '.join(cells)} |")
        if event_type is ev.ApprovalDenied:
            resumes = " or ".join(s.value for s in RESUMABLE)
            lines.append(
                f"| `{tag_of(ev.ApprovalGranted)}` | awaiting_approval → the event's `resume`"
                f" ({resumes}) |"
            )
    return "\n".join(lines)


def render_a2a_table() -> str:
    lines = ["| state | terminal | A2A TaskState |", "|---|---|---|"]
    for state in TaskState:
        lines.append(
            f"| {state.value} | {'yes' if state in TERMINAL else ''} | `{A2A_STATE[state]}` |"
        )
    return "\n".join(lines)


def _between(text: str, name: str) -> str:
    m = re.search(rf"<!-- {name}:begin -->\n(.*?)\n<!-- {name}:end -->", text, re.S)
    assert m, f"README.md has no <!-- {name}:begin/end --> block"
    return m.group(1).strip()


def test_state_table_is_generated_into_the_states_page() -> None:
    """The state table lives in the docs (reference/states.md), generated at build time by
    ``render_transition_table`` (docs/_hooks/reference.py): a row for every event type."""
    page = Path(__file__).resolve().parents[2] / "docs" / "reference" / "states.md"
    assert "\n<!-- generated: transitions -->\n" in page.read_text(encoding="utf-8")
    listed = re.findall(r"^\| `([a-z_.0-9]+)` \|", render_transition_table(), re.M)
    assert sorted(listed) == sorted({tag_of(t) for t in TRANSITIONS} | {tag_of(ev.ApprovalGranted)})


STATES_PAGE = Path(__file__).resolve().parents[2] / "docs" / "reference" / "states.md"


def test_a2a_table_is_generated_into_the_states_page() -> None:
    """The A2A mapping lives in the docs (reference/states.md), generated at build time by
    ``render_a2a_table`` (docs/_hooks/reference.py): one row per state, its A2A name."""
    assert "\n<!-- generated: a2a-states -->\n" in STATES_PAGE.read_text(encoding="utf-8")
    rows = re.findall(r"^\| (\w+) \| (yes|) \| `(\w+)` \|$", render_a2a_table(), re.M)
    assert [r[0] for r in rows] == [s.value for s in TaskState]
    for name, terminal, a2a in rows:
        assert a2a == A2A_STATE[TaskState(name)] and a2a in A2A_STATES
        assert (terminal == "yes") == (TaskState(name) in TERMINAL)


def test_every_event_type_says_what_it_means() -> None:
    """The event catalogue (docs/reference/events.md) is generated from each event class's own
    docstring: every class has one, and its first paragraph is a sentence."""
    undocumented = [
        t.__name__ for t in EVENT_TYPES if not (t.__dict__.get("__doc__") or "").strip()
    ]
    assert undocumented == []
    for t in EVENT_TYPES:
        first = t.__dict__["__doc__"].strip().split("\n\n")[0]
        assert first[0].isupper() and first.rstrip().endswith("."), (tag_of(t), first)


if __name__ == "__main__":
    print("<!-- transitions:begin -->")
    print(render_transition_table())
    print("<!-- transitions:end -->\n")
    print(render_a2a_table())

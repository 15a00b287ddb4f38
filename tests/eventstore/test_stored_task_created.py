"""A ``task.created.v1`` body as stored before the task spec was declared once still reads.

The bytes below were written by ``seal`` with the code of that time (fields
in their old order, no ``retry``). The spec's declaration moved to
``eventstore.taskspec`` and the encoded field order changed with it; reading
goes by name and the hash is of the stored bytes, so old logs are unaffected.
"""

from __future__ import annotations

import hashlib

from cardbus.eventstore import NewEvent
from cardbus.eventstore import events as ev
from cardbus.eventstore.envelope import GENESIS_HASH, decode_body, seal, verify_chain
from cardbus.eventstore.taskspec import TaskOptions, TaskSpec

STORED_BODY = (
    b'{"event_id":"0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b","stream":"draft-1","version":1,'
    b'"recorded_at":1720000000.25,"correlation_id":"root-1","causation_id":"evt-c",'
    b'"actor":"orchestrator","traceparent":"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",'
    b'"data":{"type":"task.created.v1","root_id":"root-1","parent_id":"parent-1",'
    b'"capability":"write","goal":"a draft","inputs":{"topic":"tides","facts":'
    b'{"$dep":"research-1","path":"facts"}},"constraints":{"language":"en"},'
    b'"deps":["research-1"],"timeout_s":12.5,"max_attempts":4,"budget_tokens":900,'
    b'"requires_approval":true,"fanout":2,"review_by":"review","max_review_rounds":1,'
    b'"plan_id":"draft","forked_from":"evt-0","role":""}}'
)
STORED_HASH = "ef3e3627ffddf5719bab5c7b1930407b0040caa449d59c34e475571dd6229c9c"

EXPECTED = ev.TaskCreated(
    root_id="root-1",
    parent_id="parent-1",
    capability="write",
    goal="a draft",
    inputs={"topic": "tides", "facts": {"$dep": "research-1", "path": "facts"}},
    constraints={"language": "en"},
    deps=["research-1"],
    timeout_s=12.5,
    max_attempts=4,
    budget_tokens=900,
    requires_approval=True,
    fanout=2,
    review_by="review",
    max_review_rounds=1,
    plan_id="draft",
    forked_from="evt-0",
    role="",
)


def test_the_stored_body_still_decodes_to_the_same_event() -> None:
    env = decode_body(STORED_BODY, position=1, hash=STORED_HASH)
    assert env.data == EXPECTED
    assert env.data.retry is None  # written before per-task retry settings: the policy's
    assert (env.stream, env.version, env.actor) == ("draft-1", 1, "orchestrator")


def test_its_hash_still_verifies() -> None:
    assert hashlib.sha256(STORED_BODY).hexdigest() == STORED_HASH
    assert verify_chain([(1, STORED_BODY, STORED_HASH)], "draft-1") == []


def test_the_same_event_written_today_has_other_bytes_and_reads_back_equal() -> None:
    """Re-encoding gives other bytes (field order, ``retry``): a new event with its own hash;
    the stored one is never re-encoded, so its hash stands."""
    old = decode_body(STORED_BODY)
    new = NewEvent(data=old.data, correlation_id="root-1", actor="orchestrator")
    sealed, body = seal(new, "draft-1", 1, GENESIS_HASH)
    assert body != STORED_BODY
    assert decode_body(body).data == old.data
    assert verify_chain([(1, body, sealed.hash)], "draft-1") == []


def test_the_event_declares_the_spec_by_inheriting_it() -> None:
    assert issubclass(ev.TaskCreated, TaskOptions) and issubclass(TaskOptions, TaskSpec)
    fields = set(ev.TaskCreated.__struct_fields__)
    assert set(TaskOptions.__struct_fields__) <= fields
    assert fields - set(TaskOptions.__struct_fields__) == {
        "root_id",
        "parent_id",
        "max_attempts",
        "budget_tokens",
        "plan_id",
        "forked_from",
        "role",
        "origin",
        "replay_strict",
        "child",  # a child-run task's spec (bus.orchestrator.children), None for the rest
    }

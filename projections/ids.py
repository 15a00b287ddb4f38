"""Ids as people type them: a full task or root id, a plan id, or a unique prefix.

:func:`resolve_id` is what every command taking a task or run id calls. In
order, ``text`` is:

1. an id the log has a stream for (a task id, a root id): itself; a plan's
   stream (``plan-<plan_id>``): the root id of that plan's run;
2. a plan id (``plan_id`` of a plan that was submitted): its run's root id;
3. a prefix of task and root ids: the one id it matches. When it matches a
   run and only tasks of that run, the run wins; when it matches a task and
   only ids that extend that one (a task and its reviews, ``draft-...`` and
   ``draft-...~review1``), the shortest wins.

Nothing matching is ``StreamNotFound``; several matches are ``AmbiguousId``
naming them in full. Steps 1 and 2 read one stream each; a prefix costs one
pass over the log (UUIDv7 root ids begin with their time, so runs made within
the same minute share their first 8 characters: the error then lists them).
"""

from __future__ import annotations

from cardbus.eventstore import events as ev
from cardbus.eventstore.errors import AmbiguousId, StreamNotFound, ValidationError
from cardbus.eventstore.store import EventStore

__all__ = ["resolve_id"]

_PAGE = 5000


async def _plan_root(store: EventStore, stream: str) -> str | None:
    for env in await store.read_stream(stream):
        if isinstance(env.data, ev.PlanSubmitted):
            return env.data.root_id
    return None


async def resolve_id(store: EventStore, text: str) -> str:
    """The full task or root id ``text`` names; see the module docstring."""
    text = text.strip()
    if not text:
        raise ValidationError("an id is needed: a task or root id, a plan id, or a prefix")
    if await store.stream_version(text) > 0:
        if text.startswith("plan-"):
            root = await _plan_root(store, text)
            if root is not None:
                return root
        return text
    root = await _plan_root(store, f"plan-{text}")
    if root is not None:
        return root
    matches: dict[str, str] = {}  # id -> the root of its run
    by_plan: list[str] = []  # runs started with plan id ``text`` (and no plan stream)
    position = 1
    while True:
        page = await store.read_all(position, _PAGE)
        for env in page:
            data = env.data
            if type(data) is ev.TaskCreated:
                if env.stream.startswith(text):
                    matches[env.stream] = data.root_id
            elif type(data) is ev.RunStarted:
                if env.stream.startswith(text):
                    matches[env.stream] = env.stream
                if data.plan_id == text:
                    by_plan.append(env.stream)
            elif type(data) is ev.PlanSubmitted and data.root_id.startswith(text):
                matches[data.root_id] = data.root_id
        if len(page) < _PAGE:
            break
        position = page[-1].position + 1
    if len(by_plan) == 1:
        return by_plan[0]
    if by_plan:
        raise AmbiguousId(text, sorted(by_plan))  # a forked run keeps its plan id
    if not matches:
        raise StreamNotFound(text)
    if len(matches) == 1:
        return next(iter(matches))
    roots = set(matches.values())
    if len(roots) == 1 and (run_root := roots.pop()) in matches:
        return run_root  # a run and some of its own tasks: the run
    shortest = min(matches, key=len)
    if all(m.startswith(shortest) for m in matches):
        return shortest
    raise AmbiguousId(text, sorted(matches))

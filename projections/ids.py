"""Ids as people type them: a full task or root id, a plan id, or a unique prefix.

:func:`resolve_id` is what every command taking a task or run id calls. In
order, ``text`` is:

1. an id the log has a stream or a run for (a task id, a root id): itself;
   a plan's stream (``plan-<plan_id>``): the root id of that plan's run;
2. a plan id (``plan_id`` of a plan that was submitted): its run's root id;
3. a prefix of task and root ids: the one id it matches. When it matches a
   run and only tasks of that run, the run wins; when it matches a task and
   only ids that extend that one (a task and its reviews, ``draft-...`` and
   ``draft-...~review1``), the shortest wins;
4. if no id begins with it, the end of one, by the same rules: UUIDv7 root
   ids begin with their time (runs started within the same minute share their
   first 8 characters) and end with random ones, as their tasks' ids do.

Nothing matching is ``IdNotFound`` (a ``StreamNotFound``); several matches are ``AmbiguousId``
naming them in full. Steps 1 and 2 read one stream each; a prefix costs one
pass over the log.
"""

from __future__ import annotations

from cardbus.eventstore import events as ev
from cardbus.eventstore.envelope import Envelope
from cardbus.eventstore.errors import AmbiguousId, IdNotFound, ValidationError
from cardbus.eventstore.store import EventStore

__all__ = ["read_run", "resolve_id"]

_PAGE = 5000


async def _plan_root(store: EventStore, stream: str) -> str | None:
    for env in await store.read_stream(stream):
        if isinstance(env.data, ev.PlanSubmitted):
            return env.data.root_id
    return None


def _match(text: str, id: str, root: str, starts: dict[str, str], ends: dict[str, str]) -> None:
    if id.startswith(text):
        starts[id] = root
    elif not starts and id.endswith(text):
        ends[id] = root


async def resolve_id(store: EventStore, text: str) -> str:
    """The full task or root id ``text`` names; see the module docstring."""
    text = text.strip()
    if not text:
        raise ValidationError("an id is needed: a task or root id, a plan id, or a prefix")
    if await store.stream_version(text) > 0 or await store.read_correlation(text):
        if text.startswith("plan-"):
            root = await _plan_root(store, text)
            if root is not None:
                return root
        return text
    root = await _plan_root(store, f"plan-{text}")
    if root is not None:
        return root
    matches: dict[str, str] = {}  # id -> the root of its run, for ids beginning with text
    ends: dict[str, str] = {}  # the same for ids ending with text
    by_plan: list[str] = []  # runs started with plan id ``text`` (and no plan stream)
    position = 1
    while True:
        page = await store.read_all(position, _PAGE)
        for env in page:
            data = env.data
            if type(data) is ev.TaskCreated:
                _match(text, env.stream, data.root_id, matches, ends)
                _match(text, data.root_id, data.root_id, matches, ends)
            elif type(data) is ev.RunStarted:
                _match(text, env.stream, env.stream, matches, ends)
                if data.plan_id == text:
                    by_plan.append(env.stream)
            elif type(data) is ev.PlanSubmitted:
                _match(text, data.root_id, data.root_id, matches, ends)
        if len(page) < _PAGE:
            break
        position = page[-1].position + 1
    if len(by_plan) == 1:
        return by_plan[0]
    if by_plan:
        raise AmbiguousId(text, sorted(by_plan))  # a forked run keeps its plan id
    matches = matches or ends
    if not matches:
        raise IdNotFound(text)
    if len(matches) == 1:
        return next(iter(matches))
    roots = set(matches.values())
    if len(roots) == 1 and (run_root := roots.pop()) in matches:
        return run_root  # a run and some of its own tasks: the run
    if matches is not ends:
        shortest = min(matches, key=len)
        if all(m.startswith(shortest) for m in matches):
            return shortest
    raise AmbiguousId(text, sorted(matches))


async def read_run(store: EventStore, text: str) -> list[Envelope]:
    """The events of the run ``text`` names (a root or task id, a plan id, a prefix)."""
    own = await store.read_stream(await resolve_id(store, text))
    root = own[0].correlation_id if own else text
    events = await store.read_correlation(root)
    if not events:
        raise IdNotFound(text)
    return events

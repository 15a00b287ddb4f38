"""Planners as agents: from a goal and the live agents' cards to a plan.

Both planners offer the capability ``plan`` (:data:`PLAN_CAPABILITY`). A
planning card's inputs are a :class:`PlanRequest`: the goal, the session
fields the plan lets through, one :class:`CapabilityInfo` per capability the
live agents offer (name, description, input and output JSON Schemas), the
optional :class:`PlanLimits` (capabilities allowed, the capability or output
type wanted at the end, a maximum number of tasks) and, when a proposal was
refused, its ``errors`` and the ``previous`` proposal. The output is a
:class:`PlanProposal`: a plan in the plan format (the JSON ``cardbus run
PLAN.json`` reads, ``{goal, tasks: [{id, capability, goal, inputs, deps}]}``
with ``{"$dep": id, "path": "a.b"}`` placing a dependency's output), whose JSON
Schema is :func:`plan_json_schema`.

* :class:`RulePlanner` needs no model and is deterministic: it chains
  capabilities by their schemas toward the capability (or output type) wanted,
  or the one whose description best matches the goal, and plans each further
  step the goal names; what it cannot tell it asks for, never guesses.
* :class:`LLMPlanner` is an :class:`~cardbus.agents.llm_agent.LLMAgent` asked
  for the plan schema as structured output; :func:`check_plan` sends a
  proposal that cannot run back to the model before it leaves the agent.

The orchestrator checks every proposal again, exactly as a hand-written plan.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from typing import Any

import msgspec

from cardbus.agents.agent import Agent, Capability, Reject, TaskContext
from cardbus.agents.cards import AgentCard, TaskCard
from cardbus.agents.embedding import DEFAULT_EMBEDDER
from cardbus.agents.llm_agent import LLMAgent
from cardbus.agents.schema import schema_errors

__all__ = [
    "PLAN_CAPABILITY",
    "CapabilityInfo",
    "LLMPlanner",
    "PlanLimits",
    "PlanProposal",
    "PlanRequest",
    "ProposedTask",
    "RulePlanner",
    "capability_infos",
    "check_plan",
    "free_text_inputs",
    "plan_json_schema",
    "plan_request",
]

PLAN_CAPABILITY = "plan"


# -- the plan format -------------------------------------------------------------------


class ProposedTask(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One task of a plan, in the plan format (a subset of ``cardbus.PlanTask``'s fields)."""

    id: str
    capability: str
    goal: str = ""
    inputs: dict[str, Any] = {}  # literal values, or {"$dep": task id, "path": "a.b"}
    deps: list[str] = []
    constraints: dict[str, Any] = {}  # e.g. {"model": "small-model"} for an LLM agent
    review_by: str | None = None  # the capability that reviews this task's output
    # the run can do without it: its failure leaves its output absent for its dependents
    # and the run completes "degraded" instead of failing
    optional: bool = False


class PlanProposal(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """A plan in the plan format: what a planner proposes and ``cardbus run`` reads.

    ``from_goal``: the inputs whose values the planner took from the goal's own
    words (task id -> input names), said so rather than passed off as given; the
    orchestrator records them (with any it finds itself) in ``plan.proposed`` and
    refuses one for an input that does not take free text.
    """

    goal: str
    tasks: list[ProposedTask]
    from_goal: dict[str, list[str]] = {}


def plan_json_schema() -> dict[str, Any]:
    """The JSON Schema of the plan format a planner proposes (:class:`PlanProposal`)."""
    return msgspec.json.schema(PlanProposal)


# -- the planning card ------------------------------------------------------------------


class CapabilityInfo(msgspec.Struct, frozen=True, kw_only=True):
    """One capability the live agents offer, as a planner sees it."""

    name: str
    description: str = ""
    input_schema: dict[str, Any] = {}
    output_schema: dict[str, Any] = {}


class PlanLimits(msgspec.Struct, frozen=True, kw_only=True):
    capabilities: list[str] | None = None  # the capabilities a plan may use (None: all)
    final_capability: str | None = None  # the capability wanted at the end
    final_output: str | None = None  # or the output type wanted at the end (e.g. "Draft")
    max_tasks: int | None = None


class PlanRequest(msgspec.Struct, frozen=True, kw_only=True):
    """The inputs of a planning card: all a planner sees."""

    goal: str
    session: dict[str, Any] = {}  # the session fields the plan lets through
    capabilities: list[CapabilityInfo] = []
    limits: PlanLimits = PlanLimits()
    errors: list[str] = []  # why the previous proposal was refused
    previous: PlanProposal | None = None  # that proposal


def capability_infos(cards: Iterable[AgentCard]) -> list[CapabilityInfo]:
    """One entry per capability name the cards offer (the first card's wins), ``plan`` left out."""
    seen: dict[str, CapabilityInfo] = {}
    for card in cards:
        for spec in card.capabilities:
            if spec.name == PLAN_CAPABILITY or spec.name in seen:
                continue
            seen[spec.name] = CapabilityInfo(
                name=spec.name,
                description=spec.description or card.description,
                input_schema=spec.input_schema,
                output_schema=spec.output_schema,
            )
    return list(seen.values())


def plan_request(
    goal: str,
    cards: Iterable[AgentCard],
    *,
    session: dict[str, Any] | None = None,
    limits: PlanLimits | None = None,
    errors: Sequence[str] = (),
    previous: PlanProposal | None = None,
) -> PlanRequest:
    """The planning card's inputs for ``goal`` and the live agents' ``cards``."""
    return PlanRequest(
        goal=goal,
        session=dict(session or {}),
        capabilities=capability_infos(cards),
        limits=limits or PlanLimits(),
        errors=list(errors),
        previous=previous,
    )


# -- checks a planner runs on its own proposal ------------------------------------------------


def check_plan(plan: PlanProposal, request: PlanRequest) -> list[str]:
    """Every reason ``plan`` cannot run with the request's capabilities and limits.

    The same kinds of checks the orchestrator makes (it makes them again):
    task ids, capabilities offered and allowed, deps known and declared,
    no cycle, required inputs present, literal inputs fitting the schemas,
    the limits.
    """
    errors: list[str] = []
    caps = {c.name: c for c in request.capabilities}
    allowed = request.limits.capabilities
    if not plan.tasks:
        return ["the plan has no tasks"]
    limit = request.limits.max_tasks
    if limit is not None and len(plan.tasks) > limit:
        errors.append(f"the plan has {len(plan.tasks)} tasks, at most {limit} are allowed")
    ids = [t.id for t in plan.tasks]
    for t in plan.tasks:
        if not t.id or any(c in t.id for c in " .*>~\t\n"):
            errors.append(f"task id {t.id!r} must be non-empty without spaces or . * > ~")
        if ids.count(t.id) > 1 and ids.index(t.id) != plan.tasks.index(t):
            errors.append(f"task id {t.id!r} appears twice")
        for cap in filter(None, [t.capability, t.review_by]):
            if cap not in caps:
                errors.append(f"task {t.id!r}: no registered agent offers capability {cap!r}")
            elif allowed is not None and cap not in allowed:
                errors.append(f"task {t.id!r}: capability {cap!r} is not allowed")
        for d in t.deps:
            if d not in ids:
                errors.append(f"task {t.id!r} depends on unknown task {d!r}")
        for ref in _dep_refs(t.inputs):
            if ref not in t.deps:
                errors.append(f"task {t.id!r} reads the output of {ref!r} without declaring it")
        info = caps.get(t.capability)
        if info is not None:
            _props, required, _defs = _shape(info.input_schema)
            missing = [r for r in required if r not in t.inputs]
            if missing:
                errors.append(f"task {t.id!r}: required inputs {missing} are missing")
            for problem in schema_errors(t.inputs, info.input_schema, partial=True)[:3]:
                errors.append(f"task {t.id!r}: inputs {problem}")
    if not errors and _has_cycle(plan):
        errors.append("the plan has a dependency cycle")
    final = request.limits.final_capability
    if (
        final
        and plan.tasks
        and plan.tasks[-1].capability != final
        and not any(t.capability == final for t in plan.tasks)
    ):
        errors.append(f"the plan must end with capability {final!r}")
    return errors


def _dep_refs(value: Any) -> Iterable[str]:
    if isinstance(value, dict):
        if "$dep" in value:
            yield str(value["$dep"])
        else:
            for v in value.values():
                yield from _dep_refs(v)
    elif isinstance(value, list):
        for v in value:
            yield from _dep_refs(v)


def _has_cycle(plan: PlanProposal) -> bool:
    deps = {t.id: set(t.deps) for t in plan.tasks}
    done: set[str] = set()
    while len(done) < len(deps):
        ready = [t for t, ds in deps.items() if t not in done and ds <= done]
        if not ready:
            return True
        done.update(ready)
    return False


# -- schema helpers (planners see JSON Schemas, never Python types) ----------------------------

_NOISE = ("title", "description", "default", "examples")


def _shape(schema: dict[str, Any]) -> tuple[dict[str, Any], list[str], dict[str, Any]]:
    """(properties, required, $defs) of an object schema, its top-level $ref resolved."""
    defs = schema.get("$defs", {}) if isinstance(schema, dict) else {}
    body: Any = schema
    ref = body.get("$ref") if isinstance(body, dict) else None
    if isinstance(ref, str):
        body = defs.get(ref.rsplit("/", 1)[-1], {})
    if not isinstance(body, dict):
        return {}, [], defs
    return dict(body.get("properties", {})), list(body.get("required", [])), defs


def _type_name(schema: dict[str, Any]) -> str:
    ref = schema.get("$ref")
    if isinstance(ref, str):
        return ref.rsplit("/", 1)[-1]
    return str(schema.get("title", ""))


def _sig(schema: Any, defs: dict[str, Any], depth: int = 0) -> Any:
    """A comparable form of a (sub)schema: refs resolved, titles and defaults dropped."""
    if depth > 20:
        return "..."
    if isinstance(schema, dict):
        ref = schema.get("$ref")
        if isinstance(ref, str):
            return _sig(defs.get(ref.rsplit("/", 1)[-1], {}), defs, depth + 1)
        return {k: _sig(v, defs, depth + 1) for k, v in sorted(schema.items()) if k not in _NOISE}
    if isinstance(schema, list):
        return [_sig(v, defs, depth + 1) for v in schema]
    return schema


def _same(a: Any, b: Any) -> bool:
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


_SUBJECT_FIELDS = {"topic", "subject", "query", "theme", "keywords", "search"}
#: inputs that take the goal's own words: these names, or a schema with ``"x-free-text": true``
_FREE_TEXT_FIELDS = {"goal", "text", "prompt", "question", "request", "instructions", "message"}
FREE_TEXT_KEY = "x-free-text"
_SUBJECT = re.compile(r"\b(?:about|on|regarding|concerning)\s+(.+)", re.I)


def goal_subject(goal: str) -> str:
    """What a goal is about: "Write a short report on tides" -> "tides" (else the goal)."""
    match = _SUBJECT.search(goal)
    subject = match.group(1) if match else goal
    return subject.strip().rstrip(".!?;:").strip() or goal.strip()


def free_text_inputs(input_schema: dict[str, Any]) -> set[str]:
    """The inputs of a capability's ``input_schema`` that take free text (the goal's words)."""
    props, _required, defs = _shape(input_schema)
    out = set()
    for field, schema in props.items():
        body = schema
        ref = schema.get("$ref") if isinstance(schema, dict) else None
        if isinstance(ref, str):  # a named type: its own schema (``x-free-text`` beside the ref)
            body = {**defs.get(ref.rsplit("/", 1)[-1], {}), **schema}
        if takes_free_text(field, body):
            out.add(field)
    return out


def takes_free_text(field: str, schema: Any) -> bool:
    """An input the goal's words may fill: a string named like one (``topic``, ``goal``,
    ``text``, ...) or declared so (``"x-free-text": true`` in its schema,
    ``Annotated[str, msgspec.Meta(extra_json_schema={"x-free-text": True})]``)."""
    if not isinstance(schema, dict) or schema.get("type") != "string":
        return False
    declared = schema.get(FREE_TEXT_KEY)
    if declared is not None:
        return bool(declared)
    return field in _SUBJECT_FIELDS or field in _FREE_TEXT_FIELDS


# -- the rule planner ---------------------------------------------------------------------


class _Unplannable(Exception):
    """No chain; ``missing``: the inputs nobody provides (field -> the capability asking);
    ``ambiguous``: one task would feed several inputs of one capability (how to tell them
    apart, for the refusal)."""

    def __init__(
        self, message: str, missing: dict[str, str] | None = None, ambiguous: str = ""
    ) -> None:
        super().__init__(message)
        self.missing = dict(missing or {})
        self.ambiguous = ambiguous


class _FromGoal:
    """A value ``_source`` took from the goal's own words (``build`` records the input)."""

    def __init__(self, text: str) -> None:
        self.text = text


class _Chain:
    """The tasks planned so far; ``build`` adds a capability and what it needs."""

    def __init__(self, request: PlanRequest, caps: dict[str, CapabilityInfo]) -> None:
        self.request = request
        self.caps = caps
        self.subject = goal_subject(request.goal)
        self.tasks: dict[str, ProposedTask] = {}  # task id -> task (id = capability, or scoped)
        self.from_goal: dict[str, list[str]] = {}  # task id -> its inputs taken from the goal
        self._ambiguity = ""  # the last option that failed for an ambiguity, said so
        self.similarity = dict(
            zip(
                caps,
                DEFAULT_EMBEDDER.similarities(
                    request.goal, [f"{c.name}: {c.description}" for c in caps.values()]
                ),
                strict=True,
            )
        )

    def copy(self) -> _Chain:
        other = object.__new__(_Chain)
        other.__dict__.update(self.__dict__)
        other.tasks = dict(self.tasks)
        other.from_goal = dict(self.from_goal)
        return other

    def build(
        self,
        name: str,
        stack: tuple[str, ...] = (),
        goal: str | None = None,
        scope: str = "",
    ) -> str:
        """Plan capability ``name`` (and what it needs); its task id.

        ``scope``: the input this task feeds, when the session gives fields for it
        alone (``"<scope>.<field>"``): the task is ``<name>_<scope>``, one of several
        of the same capability with different inputs.
        """
        if not scope and name in self.tasks:
            return name
        cap = self.caps[name]
        props, required, defs = _shape(cap.input_schema)
        inputs: dict[str, Any] = {}
        deps: list[str] = []
        missing: dict[str, str] = {}
        worded: list[str] = []  # the inputs given the goal's words
        for field in [*required, *(p for p in props if p not in required)]:
            try:
                value = self._source(
                    name,
                    field,
                    props.get(field, {}),
                    defs,
                    field in required,
                    (*stack, name),
                    scope,
                )
            except _Unplannable as e:
                if not e.missing:
                    raise
                missing.update(e.missing)
                continue
            if value is _NONE:
                continue
            if isinstance(value, _FromGoal):
                worded.append(field)
                value = value.text
            inputs[field] = value
            for ref in _dep_refs(value):
                if ref not in deps:
                    deps.append(ref)
        if missing:
            raise _Unplannable(f"{name}: no value for {sorted(missing)}", missing)
        self._one_value_twice(name, inputs, props, defs)
        text = goal or f"{cap.description or cap.name}: {self.subject}"
        task_id = f"{name}_{scope}" if scope else name
        for planned in self.tasks.values():  # the same capability with the same inputs: reuse
            if planned.capability == name and planned.inputs == inputs and goal is None:
                return planned.id
        self.tasks[task_id] = ProposedTask(
            id=task_id, capability=name, goal=text, inputs=inputs, deps=deps
        )
        if worded:
            self.from_goal[task_id] = worded
        return task_id

    def _one_value_twice(
        self, name: str, inputs: dict[str, Any], props: dict[str, Any], defs: dict[str, Any]
    ) -> None:
        """Refuse one planned output read whole by several inputs of one task.

        ``current`` and ``previous`` both fed by the one ``sales_query`` task is no
        comparison: the inputs differ only in what the user did not say. The user
        tells them apart with scoped inputs (``--input current.period=...``), which
        plan the feeding capability once for each.
        """
        readers: dict[str, list[str]] = {}
        for field, value in inputs.items():
            if isinstance(value, dict) and "$dep" in value:
                readers.setdefault(json.dumps(value, sort_keys=True), []).append(field)
        for key, fields in readers.items():
            if len(fields) < 2:
                continue
            feeder = self.tasks.get(str(json.loads(key)["$dep"]))
            given = sorted(
                k for k, v in (feeder.inputs if feeder else {}).items() if not _dep_refs_any(v)
            )
            kind = _type_name(props.get(fields[0], {})) or "the same type"
            named = " and ".join(repr(f) for f in fields)
            example = given[0] if given else "FIELD"
            flags = " ".join(f"--input {f}.{example}=..." for f in fields)
            source = feeder.capability if feeder else "one task"
            hint = (
                f"{name!r} takes {named} ({kind}) and one {source!r} task would feed"
                f" {'both' if len(fields) == 2 else 'all'} the same value: give each its own"
                f" inputs with {flags}"
                + (f" (any input of {source!r}: {', '.join(given)})" if given else "")
            )
            raise _Unplannable(f"{name}: {named} would read one task", ambiguous=hint)

    def _session(self, field: str, schema: Any, defs: dict[str, Any], scope: str) -> Any:
        """The session's value for ``field`` (``<scope>.<field>`` first) if its type fits."""
        session = self.request.session
        for key in ([f"{scope}.{field}"] if scope else []) + [field]:
            if key not in session:
                continue
            value = session[key]
            full = {**schema, "$defs": defs}
            if not schema_errors(value, full):
                return value
            if isinstance(value, str):  # `--input n=3` gives text: the JSON it spells
                try:
                    decoded = json.loads(value)
                except ValueError:
                    continue
                if not schema_errors(decoded, full):
                    return decoded
        return _NONE

    def _scoped(self, field: str) -> bool:
        return any(k.startswith(f"{field}.") for k in self.request.session)

    def _source(
        self,
        name: str,
        field: str,
        schema: Any,
        defs: dict[str, Any],
        required: bool,
        stack: tuple[str, ...],
        scope: str = "",
    ) -> Any:
        wanted = _sig(schema, defs)
        given = self._session(field, schema, defs, scope)
        if given is not _NONE:
            return given
        scoped = self._scoped(field)
        # a field the user gives per task (``current.period``) is never copied from another
        # task's output: which one a third task wants, only the user can say
        per_task = any(k.endswith(f".{field}") for k in self.request.session)
        if not scoped and not per_task:
            for planned, task in self.tasks.items():  # an output already planned, by field name
                if self._yields(task.capability, field, wanted):
                    return {"$dep": planned, "path": field}
        if not required:
            return _NONE
        options = []
        for other in self._allowed():
            if other in stack or other == name:
                continue
            if self._yields(other, field, wanted):
                options.append((other, field))
            elif self._is_output(other, wanted):  # the whole output fits the input
                options.append((other, ""))
            elif other == field:  # the capability named like the input: its one fitting field
                fits = self._fitting(other, wanted)
                if len(fits) == 1:
                    options.append((other, fits[0]))
        self._ambiguity = ""
        best = self._cheapest(options, stack, field if scoped else "")
        if best is not None:
            return best
        if takes_free_text(field, wanted if isinstance(wanted, dict) else {}):
            return _FromGoal(self.subject if field in _SUBJECT_FIELDS else self.request.goal)
        ambiguity = self._ambiguity
        if self._needs_user(options, stack, field if scoped else ""):
            raise _Unplannable(f"{name}: no value for {field!r}", self._missing)
        if ambiguity:  # an option fails only because the user has not told two inputs apart
            raise _Unplannable(f"{name}: {field!r} is ambiguous", ambiguous=ambiguity)
        if not options and _is_scalar(wanted):  # only the user can say: ask for it
            raise _Unplannable(f"{name}: no value for {field!r}", {field: name})
        raise _Unplannable(f"{name}: nothing provides its required input {field!r}")

    def _needs_user(
        self, options: list[tuple[str, str]], stack: tuple[str, ...], scope: str
    ) -> bool:
        """Some option failed only for inputs the user can give (kept in ``_missing``)."""
        best: dict[str, str] | None = None
        for other, _path in options:
            trial = self.copy()
            try:
                trial.build(other, stack, scope=scope)
            except _Unplannable as e:
                if e.missing and (best is None or len(e.missing) < len(best)):
                    best = e.missing
        self._missing = best or {}
        return best is not None

    def _cheapest(
        self, options: list[tuple[str, str]], stack: tuple[str, ...], scope: str = ""
    ) -> Any:
        """Of the capabilities that could feed an input, the one adding the fewest tasks."""
        scored = []
        for other, path in options:
            trial = self.copy()
            try:
                trial.build(other, stack, scope=scope)
            except _Unplannable as e:
                self._ambiguity = self._ambiguity or e.ambiguous
                continue
            scored.append((len(trial.tasks), -self.similarity.get(other, 0.0), other, path))
        if not scored:
            return None
        _, _, other, path = min(scored)
        task_id = self.build(other, stack, scope=scope)
        return {"$dep": task_id, "path": path} if path else {"$dep": task_id}

    def _allowed(self) -> list[str]:
        allowed = self.request.limits.capabilities
        return sorted(c for c in self.caps if allowed is None or c in allowed)

    def _yields(self, cap: str, field: str, wanted: Any) -> bool:
        props, _, defs = _shape(self.caps[cap].output_schema)
        return field in props and _same(_sig(props[field], defs), wanted)

    def _is_output(self, cap: str, wanted: Any) -> bool:
        """The capability's whole output has the type the input wants (an object type)."""
        schema = self.caps[cap].output_schema
        if not schema or not isinstance(wanted, dict) or wanted.get("type") != "object":
            return False
        return _same(_sig(schema, schema.get("$defs", {})), wanted)

    def _fitting(self, cap: str, wanted: Any) -> list[str]:
        props, _, defs = _shape(self.caps[cap].output_schema)
        return [p for p, s in props.items() if _same(_sig(s, defs), wanted)]

    def reviewer_for(self, target: str) -> str | None:
        """A capability reviewing the target's output: takes it as ``draft``, answers a Review."""
        out = _sig(
            self.caps[target].output_schema, self.caps[target].output_schema.get("$defs", {})
        )
        for name in self._allowed():
            if name == target:
                continue
            rprops, _, _ = _shape(self.caps[name].output_schema)
            iprops, required, idefs = _shape(self.caps[name].input_schema)
            is_review = {"passed", "issues"} <= set(rprops)
            takes = "draft" in iprops and set(required) <= {"draft", "goal"}
            if is_review and takes and _same(_sig(iprops["draft"], idefs), out):
                return name
        return None


_NONE = object()


def _dep_refs_any(value: Any) -> bool:
    return next(iter(_dep_refs(value)), None) is not None


def _is_scalar(wanted: Any) -> bool:
    return isinstance(wanted, dict) and wanted.get("type") in (
        "string",
        "integer",
        "number",
        "boolean",
    )


def _ask_for(missing: dict[str, str]) -> str:
    """How to give the inputs nobody provides: one sentence naming each."""
    names = sorted(missing)
    asked = ", ".join(f"{f!r} (of {missing[f]!r})" for f in names)
    flags = " ".join(f"--input {f}=..." for f in names)
    return (
        f"no value for the inputs {asked}: the goal's words fill only inputs that take free"
        f" text; give them with {flags} (cardbus plan, cardbus run --goal), or in the plan"
        ' file\'s "session" with "session_fields"'
    )


def rule_plan(request: PlanRequest) -> PlanProposal:
    """The rule planner's plan for ``request``; ``Reject`` (``cannot_plan``) when there is none.

    Every step the goal names (:func:`named_steps`) is in the plan, or the refusal
    names it: a plan that quietly drops "generate a report" is never proposed.
    """
    excluded = set(re.findall(r"capability '([^']+)'", " ".join(request.errors)))
    caps = {
        c.name: c
        for c in request.capabilities
        if c.name != PLAN_CAPABILITY and c.name not in excluded
    }
    if not caps:
        raise Reject("cannot_plan", "no capabilities to plan with")
    chain = _Chain(request, caps)
    steps = named_steps(request.goal, chain)
    problems = []
    missing: dict[str, str] = {}
    ambiguous = ""
    for target in _targets(request, chain):  # the best match first; the first that can be planned
        trial = chain.copy()
        try:
            final = trial.build(target, goal=request.goal)
        except _Unplannable as e:
            problems.append(f"{target!r}: {e}")
            if e.missing and not missing:
                missing = e.missing
            ambiguous = ambiguous or e.ambiguous
            continue
        chain = trial
        break
    else:
        unplanned = _steps_left(steps)
        if ambiguous:
            raise Reject("cannot_plan", ambiguous + unplanned)
        if missing:
            raise Reject("cannot_plan", _ask_for(missing) + unplanned)
        raise Reject(
            "cannot_plan", "no chain of capabilities reaches " + "; ".join(problems) + unplanned
        )
    reviewer = chain.reviewer_for(target)
    dropped = []
    for words, step in steps:  # the steps the goal names beyond the chain: each planned too
        if step == reviewer or any(t.capability == step for t in chain.tasks.values()):
            continue  # planned already (a review is the final task's ``review_by``)
        trial = chain.copy()
        try:
            trial.build(step, goal=words)
        except _Unplannable as e:
            dropped.append(
                f"the goal's step {words!r} (capability {step!r}) cannot be planned: "
                + (e.ambiguous or (_ask_for(e.missing) if e.missing else str(e)))
            )
            continue
        chain = trial
    if dropped:
        raise Reject("cannot_plan", "; ".join(dropped))
    tasks = list(chain.tasks.values())
    if reviewer is not None:
        at = next(i for i, t in enumerate(tasks) if t.id == final)
        tasks[at] = msgspec.structs.replace(tasks[at], review_by=reviewer)
    limit = request.limits.max_tasks
    if limit is not None and len(tasks) > limit:
        raise Reject("cannot_plan", f"reaching {target!r} takes {len(tasks)} tasks, max {limit}")
    plan = PlanProposal(goal=request.goal, tasks=tasks, from_goal=chain.from_goal)
    if request.previous is not None and plan == request.previous:
        raise Reject(
            "cannot_plan", "the rules give the refused plan again: " + "; ".join(request.errors)
        )
    return plan


#: what separates the steps of a goal: "query ..., do ... and generate ..."
_STEP_BREAK = re.compile(r"[,;]|\b(?:and then|then|and)\b", re.I)
#: a part of the goal names a capability when its description matches this well, and
#: clearly better than any other's (the hashing embedder: "generate a report" scores
#: 0.62 against "generate a report of ...", a bare noun phrase under 0.25)
STEP_MATCH = 0.35
STEP_MARGIN = 0.15


def named_steps(goal: str, chain: _Chain) -> list[tuple[str, str]]:
    """The steps the goal names, in its order: (its words, the capability they name).

    The goal is cut at commas, "and", "then"; a part names the capability whose
    description it matches best, if it matches well (``STEP_MATCH``) and clearly
    (``STEP_MARGIN`` over the next). A part naming nothing clearly is left to the chain.
    """
    allowed = chain._allowed()
    if len(allowed) < 2:
        return []
    parts = [p.strip(" .!?") for p in _STEP_BREAK.split(goal)]
    parts = [p for p in parts if p]
    if len(parts) < 2:
        return []
    texts = [f"{c}: {chain.caps[c].description}" for c in allowed]
    steps: list[tuple[str, str]] = []
    for part in parts:
        ranked = sorted(
            zip(DEFAULT_EMBEDDER.similarities(part, texts), allowed, strict=True), reverse=True
        )
        (best, cap), (second, _) = ranked[0], ranked[1]
        if best >= STEP_MATCH and best - second >= STEP_MARGIN and cap not in dict(steps).values():
            steps.append((part, cap))
    return steps


def _steps_left(steps: list[tuple[str, str]]) -> str:
    """The goal's steps, named in a refusal: none is planned ("" for none named)."""
    left = [f"{words!r} ({cap!r})" for words, cap in steps]
    return f"; so the goal's steps {', '.join(left)} are not planned" if left else ""


def _targets(request: PlanRequest, chain: _Chain) -> list[str]:
    """The capabilities the plan may end with, in the order to try them."""
    limits = request.limits
    allowed = chain._allowed()
    if limits.final_capability:
        if limits.final_capability not in allowed:
            raise Reject("cannot_plan", f"capability {limits.final_capability!r} is not offered")
        return [limits.final_capability]
    candidates = allowed
    if limits.final_output:
        wanted = limits.final_output.lower()
        candidates = [
            c
            for c in allowed
            if _type_name(chain.caps[c].output_schema).lower() == wanted
            or wanted in _shape(chain.caps[c].output_schema)[0]
        ]
        if not candidates:
            raise Reject("cannot_plan", f"no capability outputs {limits.final_output!r}")
    ranked = sorted(candidates, key=lambda c: (-chain.similarity.get(c, 0.0), c))
    # by type, any that can be planned will do; by the goal's words, only the best match
    return ranked if limits.final_output else ranked[:1]


class RulePlanner(Agent):
    """Plans without a model, deterministically, by chaining capabilities by their schemas.

    The last task is the capability wanted (``limits.final_capability``), one
    that outputs ``limits.final_output``, or else the capability whose
    description best matches the goal (the hashing embedder). Each input it
    requires is filled, in order, from: a session field of that name and type;
    an output field of that name and type of a task already planned; a
    capability that outputs such a field (or one named like the input with a
    single output field of its type), planned first, the one adding the
    fewest tasks; for a string that takes free text (:func:`takes_free_text`),
    the goal's subject (``topic``, ``subject``, ``query``: "a short report on
    tides" -> "tides") or the goal's text, named in the proposal's ``from_goal``.
    Optional inputs are filled only from the session and planned outputs. A
    capability that takes the final output as ``draft`` and answers a review
    (``passed``, ``issues``) becomes its ``review_by``. On a re-proposal,
    capabilities the errors name are left out.

    It never guesses silently: one task read whole by two inputs of a capability
    (``current`` and ``previous`` from one query) is refused, naming them and the
    scoped ``--input current.FIELD=...`` that plans the query once for each; a
    field given per task is never copied from one of them into a third; every
    step the goal names (:func:`named_steps`) is planned after the chain, or
    named in the refusal. No plan: ``Reject("cannot_plan")``.
    """

    agent_id = "rule-planner"
    description = "Plans a goal into tasks by chaining the capabilities' schemas (no model)."
    capabilities = [
        Capability(
            PLAN_CAPABILITY,
            PlanRequest,
            PlanProposal,
            "plan a goal into tasks by rules",
            tags=["planning"],
        )
    ]

    async def handle(self, task: TaskCard, inputs: PlanRequest, ctx: TaskContext) -> PlanProposal:
        return rule_plan(inputs)


class LLMPlanner(LLMAgent):
    """Plans a goal with a model: structured output against the plan schema, checked."""

    agent_id = "llm-planner"
    description = "Plans a goal into tasks with a language model, over the agents' cards."
    capability = PLAN_CAPABILITY
    input_type = PlanRequest
    output_type = PlanProposal
    instructions = (
        "You are the planner of a multi-agent system. Split the goal into tasks, each done by"
        " one of the listed capabilities (use only their names). Give each task a short id"
        " (letters, digits, - or _), the capability, a one-line goal and its inputs: a literal"
        ' value, or {"$dep": TASK_ID, "path": FIELD} to pass a field of an earlier task\'s'
        " output; every task you read from must be listed in deps. Inputs must fit the"
        " capability's input_schema (all required fields present); a field of an output is"
        " described by the output_schema. Respect the limits. If errors are given, your"
        " previous plan was refused for them: fix every one. Put the session's fields in"
        " inputs only where an input asks for them. Mark a task optional only when the goal"
        " can be met without its output (a best-effort extra): if it fails, the tasks after"
        " it run without the fields they read from it. Fill an input with the goal's own"
        " words only if it takes free text (a topic, a text, a question...), and name each"
        " such input in from_goal ({TASK_ID: [INPUT, ...]}); a value only the user can give"
        " (a region, a date) that the session lacks is not yours to guess."
    )

    def check(self, output: Any, inputs: Any, task: TaskCard) -> list[str]:
        return check_plan(output, inputs)

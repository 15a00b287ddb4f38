"""The console's schedule endpoints (issue 32 item 3), behind the app's guard like every
action: what they write is signed with the request's identity (its token's name).

* ``GET /api/schedules``: the schedules in the log (``?all=1``: the deleted ones too);
* ``POST /api/schedules``: create one from ``{"plan": {...} | "goal": "...", "cron": ...
  | "interval_seconds": ..., "timezone", "overlap", "catchup", "catchup_window_seconds",
  "jitter_seconds"}``;
* ``POST /api/schedules/{id}/pause|resume|trigger|delete``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from cardbus.bus.orchestrator import scheduler as ops
from cardbus.eventstore import EventStore
from cardbus.eventstore.errors import CardbusError, InvalidSchedule

__all__ = ["schedule_routes"]

_CREATE_FIELDS = (
    "cron",
    "interval_seconds",
    "timezone",
    "overlap",
    "catchup",
    "catchup_window_seconds",
    "jitter_seconds",
)

Json = Callable[[Any], Response]
Error = Callable[[Exception], Response]


def schedule_routes(
    store: Callable[[], EventStore],
    actor_of: Callable[[Request], str],
    json: Json,
    error: Error,
    body_of: Callable[[Request], Awaitable[dict[str, Any] | None]],
) -> list[Route]:
    """The routes, given the app's store, identity, response and body helpers."""

    async def listed(request: Request) -> Response:
        everything = request.query_params.get("all") in ("1", "true")
        try:
            rows = await ops.list_schedules(store(), deleted=everything)
        except CardbusError as e:
            return error(e)
        return json({"schedules": [ops.schedule_summary(s) for s in rows]})

    async def create(request: Request) -> Response:
        body = await body_of(request)
        try:
            if body is None:
                raise InvalidSchedule("the body is not JSON")
            plan = body.get("plan") or ({"goal": body["goal"]} if body.get("goal") else None)
            if not isinstance(plan, dict):
                raise InvalidSchedule('give "plan" (an object) or "goal" (a text)')
            kw = {k: body[k] for k in _CREATE_FIELDS if k in body}
            sid = await ops.create_schedule(
                store(), plan, actor=actor_of(request), **msgspec.convert(kw, dict[str, Any])
            )
        except (CardbusError, TypeError) as e:
            return error(e if isinstance(e, CardbusError) else InvalidSchedule(str(e)))
        return json({"schedule_id": sid, "by": actor_of(request)})

    async def act(request: Request) -> Response:
        sid, action = request.path_params["id"], request.path_params["action"]
        by = actor_of(request)
        try:
            match action:
                case "pause":
                    await ops.pause_schedule(store(), sid, actor=by)
                case "resume":
                    await ops.resume_schedule(store(), sid, actor=by)
                case "delete":
                    await ops.delete_schedule(store(), sid, actor=by)
                case "trigger":
                    plan_id = await ops.trigger_schedule(store(), sid, actor=by)
                    return json({"schedule_id": sid, "plan_id": plan_id, "by": by})
                case _:
                    return error(InvalidSchedule(f"no schedule action {action!r}"))
        except CardbusError as e:
            return error(e)
        return json({"schedule_id": sid, "action": action, "by": by})

    return [
        Route("/api/schedules", listed),
        Route("/api/schedules", create, methods=["POST"]),
        Route("/api/schedules/{id:str}/{action:str}", act, methods=["POST"]),
    ]

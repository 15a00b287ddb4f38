"""The console's question endpoints (issue 31 item 2), behind the app's guard: an answer
is signed with the request's identity (its token's name), never a name the body gives.

* ``GET /api/tasks/{id}/questions``: the open questions ``id`` names (the question's own
  task, the task that asked, or the run), each with its schema, choices and default: the
  page draws a form from the schema;
* ``POST /api/tasks/{id}/answer`` ``{"answer": ..., "default": false}``: the answer,
  checked against the schema; one that does not fit is a 400 whose ``field`` names where
  (the question stays open).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from cardbus.bus.orchestrator.questions import QuestionRefused, answer_question, open_questions
from cardbus.eventstore import EventStore
from cardbus.eventstore.errors import CardbusError
from cardbus.projections import resolve_id

__all__ = ["question_routes"]

Json = Callable[[Any], Response]
Error = Callable[[Exception], Response]


def question_routes(
    store: Callable[[], EventStore],
    actor_of: Callable[[Request], str],
    json: Json,
    error: Error,
    body_of: Callable[[Request], Awaitable[dict[str, Any] | None]],
) -> list[Route]:
    """The routes, given the app's store, identity, response and body helpers."""

    async def listed(request: Request) -> Response:
        try:
            ident = await resolve_id(store(), request.path_params["id"])
            waiting = await open_questions(store(), ident)
        except CardbusError as e:
            return error(e)
        return json({"id": ident, "questions": [q.as_dict() for q in waiting]})

    async def answered(request: Request) -> Response:
        body = await body_of(request)
        if body is None:
            return JSONResponse({"error": "the body is not JSON"}, status_code=400)
        by = actor_of(request)
        try:
            ident = await resolve_id(store(), request.path_params["id"])
            q, given = await answer_question(
                store(),
                ident,
                body.get("answer"),
                by=by,
                door="console",
                use_default=body.get("default") is True,
            )
        except QuestionRefused as e:
            return JSONResponse(
                {"error": str(e), "type": type(e).__name__, "field": e.field}, status_code=400
            )
        except CardbusError as e:
            return error(e)
        return json({"task_id": q.task_id, "answer": given, "by": by})

    return [
        Route("/api/tasks/{id:path}/questions", listed),
        Route("/api/tasks/{id:path}/answer", answered, methods=["POST"]),
    ]

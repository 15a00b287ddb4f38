"""The local web console behind ``cardbus ui`` (starlette; the ``ui`` extra).

``create_app(db)`` is the ASGI app: the page (:mod:`.page`) and the JSON and
server-sent-event views it reads (:mod:`.app`). ``serve`` runs it on uvicorn.
"""

from __future__ import annotations

from cardbus.tools.ui.app import create_app, is_loopback

__all__ = ["create_app", "is_loopback"]

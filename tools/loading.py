"""Load user code named by import path (``package.module:ClassName``)."""

from __future__ import annotations

import importlib
import os
import sys

from cardbus.agents.agent import Agent
from cardbus.eventstore.errors import MissingExtra, ValidationError

__all__ = ["load_agent"]


def load_agent(path: str) -> type[Agent]:
    if path.startswith("a2a+"):  # a remote A2A agent: its card is fetched now
        from cardbus.bus.a2a.remote import load_remote

        return load_remote(path)
    module_name, _, attr = path.partition(":")
    if not module_name or not attr:
        raise ValidationError(f"agent path {path!r} must look like 'package.module:ClassName'")
    if os.getcwd() not in sys.path:
        # let users name agents in their working directory; after the installed packages,
        # so a folder there never stands for one of them (openai-agents' `agents`)
        sys.path.append(os.getcwd())
    try:
        obj = getattr(importlib.import_module(module_name), attr)
    except MissingExtra:
        raise  # its own line names the extra to install
    except (ImportError, AttributeError) as e:
        raise ValidationError(f"cannot load agent {path!r}: {e}") from e
    if not (isinstance(obj, type) and issubclass(obj, Agent)):
        raise ValidationError(f"{path!r} is not an Agent subclass")
    return obj

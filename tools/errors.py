"""How a ``cardbus`` command ends when it does not succeed: one line on stderr, an exit code.

Exit codes (``docs/how-to/errors.md`` shows each case):

=====  ======================================================================
0      done; a run the command waited for completed
1      an error (one line on stderr: ``Error: ...``), or a run that failed or
       halted (its last line on stdout names the failed task and why)
2      a usage error: a wrong flag or argument (click's)
124    timed out waiting (``--timeout``); the run the command started is
       cancelled first, with the reason ``client_timed_out`` in the log
=====  ======================================================================

124 is what ``timeout(1)`` exits with, so scripts that already tell a timeout
from a failure keep working.

:func:`one_line` is the one place where an exception becomes that line: the
command group (``tools/cli.py``) calls it for whatever a command raises, so
commands never catch errors just to print them. Every ``CardbusError`` is one
line; an optional extra that is not installed (``ModuleNotFoundError`` of a
module an extra brings) is :class:`MissingExtra`'s line; any other exception
is a bug and keeps its traceback.
"""

from __future__ import annotations

import re

import click

from cardbus.eventstore.errors import CardbusError, MissingExtra

__all__ = [
    "EXIT_FAILED",
    "EXIT_OK",
    "EXIT_TIMEOUT",
    "EXIT_USAGE",
    "EXTRA_OF_MODULE",
    "TimedOut",
    "one_line",
]

EXIT_OK = 0
EXIT_FAILED = 1  # an error, or a run that did not complete
EXIT_USAGE = 2  # click.UsageError's
EXIT_TIMEOUT = 124  # as timeout(1)

#: the top-level module of an optional dependency -> the extra that installs it
EXTRA_OF_MODULE = {
    "mcp": "mcp",
    "mcp_types": "mcp",
    "httpx2": "mcp",
    "a2a": "a2a",
    "uvicorn": "ui",
    "starlette": "ui",
    "openai": "openai",
    "pydantic_ai": "pydantic-ai",
    "genai_prices": "prices",
    "mkdocs": "docs",
    "mkdocstrings": "docs",
}


class TimedOut(CardbusError, click.ClickException):
    """A command gave up waiting (``--timeout``): one line, exit code 124. A
    ``CardbusError`` like every error cardbus raises; click prints it as it prints a
    ``ClickException``."""

    exit_code = EXIT_TIMEOUT


def _flat(text: str) -> str:
    """``text`` on one line: line breaks (and the blanks around them) become ``"; "``."""
    return re.sub(r"\s*\n\s*", "; ", text.strip()) or "(no message)"


def one_line(e: BaseException) -> click.ClickException | None:
    """The one-line ``ClickException`` that says ``e``, or None when ``e`` is a bug (it keeps
    its traceback)."""
    if isinstance(e, click.ClickException):
        return None  # click prints it already
    if isinstance(e, CardbusError):
        return click.ClickException(_flat(str(e)))
    if isinstance(e, ModuleNotFoundError):
        extra = EXTRA_OF_MODULE.get((e.name or "").partition(".")[0])
        if extra is not None:
            return click.ClickException(str(MissingExtra(extra)))
    if isinstance(e, TimeoutError):  # a wait no command turned into its own line
        return TimedOut(_flat(f"timed out: {e}" if str(e) else "timed out"))
    return None

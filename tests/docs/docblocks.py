"""Run the fenced code blocks of a Markdown page, in order, in a fresh working directory.

The rules (docs/how-to/write-docs.md says the same to the pages' writers):

* Every fence names its language; one this module does not know fails the page,
  so no block is left out by accident.
* ``python``: executed in the page's namespace (blocks share it, as a reader's
  session would), with the working directory as the current directory and on
  ``sys.path``; a top-level ``await`` runs in a fresh event loop. A block with a
  top-level ``await`` is for Python's asyncio REPL (``python -m asyncio``), so it
  must paste there as it is: fed line by line as that REPL compiles them (a
  blank line ends a compound statement; a statement after one needs a blank line
  before it), it must raise no ``SyntaxError``.
* A block with a title (```` ```python title="my_agents.py" ````) is a file: it is
  written into the working directory (later blocks and commands use it), and a
  Python file is also executed once as a module to check it runs.
* ``sh``, ``bash``, ``shell``: the block is a bash script (``set -euo pipefail``);
  ``console``: the lines after ``$ `` are the commands and the rest is output.
  A command that is meant to fail says with which code, in a comment at its end:
  ``cardbus verify --db bad.db  # exit code 1`` runs the command and fails the page
  unless it exits with exactly that code (no ``|| echo``/``|| true`` hides a failure).
  They run in the working directory with the venv's ``bin`` first on ``PATH``
  (``cardbus``, ``python``), no ``CARDBUS_STORE`` and no ``OPENAI_*`` variables
  (so the LLM agents get the deterministic mock). The working directory stands
  for a clone: ``.venv`` in it is the running venv (``source .venv/bin/activate``
  works), and ``make TARGET`` (the set-up commands) is checked with ``make -n``
  against the repository: it must resolve (the fresh-clone run is timed by hand,
  not in the suite). A ``cd`` carries over to the next blocks, but may not leave
  the working directory. What the blocks leave running (a server started with
  ``&``, when a block fails before the page's ``kill``) is killed when the page ends.
* ``json`` without a title must parse; ``text``, ``toml``/``yaml``/``ini`` and ``js`` are
  shown, not run.
* A block that needs a real external endpoint (a hosted model, a remote A2A
  agent) is skipped only with an explicit marker on the line before its fence::

      <!-- docs-test: skip: needs a real endpoint (OPENAI_BASE_URL) -->

  The reason must say it needs a real endpoint; any other skip fails the page.
* A page whose commands need a program cardbus does not install (Node.js for the
  tutorial of an agent in another language) names it in a marker of its own line::

      <!-- docs-test: needs: node npm -->

  Where one is not on ``PATH`` the page's test is skipped, naming it (``pytest -rs``
  lists it); where they all are, the page runs as any other.

A failing block raises ``BlockFailed`` naming the file, the line of its fence and
what went wrong.
"""

from __future__ import annotations

import ast
import asyncio
import codeop
import contextlib
import inspect
import json
import os
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
PYTHON = {"python", "py"}
SHELL = {"sh", "bash", "shell"}
CONSOLE = {"console"}
SHOWN = {"text", "toml", "yaml", "ini", "json", "javascript", "js"}
KNOWN = PYTHON | SHELL | CONSOLE | SHOWN
SKIP = re.compile(r"^<!-- docs-test: skip: (.+?) -->$")
NEEDS = re.compile(r"^<!-- docs-test: needs: ([\w .+-]+?) -->$")
FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})[ \t]*(?P<info>[^`]*)$")
TITLE = re.compile(r"""title=["']([^"']+)["']""")
BLOCK_TIMEOUT_S = 120.0


class BlockFailed(AssertionError):
    """A block of a page did not run: the file, the fence's line and why."""


@dataclass(frozen=True)
class Block:
    path: Path
    line: int  # the fence's line, from 1
    lang: str
    title: str | None
    code: str
    skip: str | None  # the reason of a docs-test skip marker

    @property
    def where(self) -> str:
        try:
            shown = self.path.relative_to(REPO)
        except ValueError:
            shown = self.path
        return f"{shown}:{self.line}"


def parse(text: str, path: Path) -> list[Block]:
    """The fenced blocks of a Markdown text, in order."""
    lines = text.splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, fence, info = m.group("indent"), m.group("fence"), m.group("info").strip()
        start = i
        body: list[str] = []
        i += 1
        while i < len(lines) and not (
            lines[i].strip().startswith(fence) and set(lines[i].strip()) == {fence[0]}
        ):
            line = lines[i]
            body.append(line[len(indent) :] if line.startswith(indent) else line.lstrip())
            i += 1
        if i == len(lines):
            raise BlockFailed(f"{path}:{start + 1}: a fence that is never closed")
        i += 1
        lang = info.split()[0].lstrip("{.").rstrip("}") if info else ""
        title = TITLE.search(info)
        prev = next((lines[j].strip() for j in range(start - 1, -1, -1) if lines[j].strip()), "")
        skip = SKIP.match(prev)
        blocks.append(
            Block(
                path=path,
                line=start + 1,
                lang=lang,
                title=title.group(1) if title else None,
                code="\n".join(body) + "\n",
                skip=skip.group(1) if skip else None,
            )
        )
    return blocks


# ``cmd || echo ...``, ``|| true``, ``|| :``, ``|| test $? ...``, ``|| exit 0``: a failure
# hidden (a page whose command stopped working would still pass); ``# exit code N`` says it
HIDDEN_FAILURE = re.compile(r"\|\|\s*(?:echo\b|true\b|:(?:\s|$)|test\s+\$\?|exit\s+0\b)", re.M)


def check(blocks: list[Block]) -> None:
    """Every fence names a known language; every skip needs a real endpoint; no command
    hides a failure."""
    for b in blocks:
        if b.lang in SHELL | CONSOLE and (hidden := HIDDEN_FAILURE.search(shell_script(b))):
            raise BlockFailed(
                f"{b.where}: a command hides a failure ({hidden.group(0)!r}): say the exit"
                " code it must end with instead ('cmd  # exit code 1')"
            )
        if b.lang not in KNOWN:
            raise BlockFailed(
                f"{b.where}: a fence must name one of {sorted(KNOWN)} (got {b.lang!r})"
            )
        if b.lang in PYTHON and b.title is None and (error := repl_paste_error(b.code)):
            raise BlockFailed(
                f"{b.where}: uses top-level await but does not paste into `python -m"
                f" asyncio`: {error}"
            )
        if b.skip is not None and "needs a real" not in b.skip:
            raise BlockFailed(
                f"{b.where}: a block is skipped only when it needs a real endpoint"
                f" ('<!-- docs-test: skip: needs a real ... -->'), not for {b.skip!r}"
            )


def repl_paste_error(code: str) -> str | None:
    """Why ``code``, a block with a top-level ``await``, fails pasted into ``python -m
    asyncio`` (None: it pastes, or it has no top-level ``await``).

    Compiled as ``code.InteractiveConsole.push`` does, line by line in ``single`` mode
    with the flag the asyncio REPL adds: a line that completes a statement runs it, so a
    blank line inside a function, or none after a ``try``/``with``/``for`` block before the
    next statement, is a ``SyntaxError`` there, though the block runs as a file.
    """
    try:
        whole = compile(code, "<block>", "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    except SyntaxError:
        return None  # run_python says so
    if not whole.co_flags & inspect.CO_COROUTINE:
        return None  # no top-level await: a script's block, run as the page says
    compiler = codeop.CommandCompiler()
    compiler.compiler.flags |= ast.PyCF_ALLOW_TOP_LEVEL_AWAIT
    buffer: list[str] = []
    for n, line in enumerate([*code.splitlines(), ""], start=1):
        buffer.append(line)
        try:
            done = compiler("\n".join(buffer), "<console>", "single")
        except (SyntaxError, OverflowError, ValueError) as e:
            return f"line {n} of the block: {type(e).__name__}: {e}"
        if done is not None:
            buffer = []
    return None


# -- running ---------------------------------------------------------------------------


def shell_env() -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("OPENAI_", "CARDBUS_STORE", "CARDBUS_DB", "CARDBUS_MODEL"))
    }
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONUNBUFFERED"] = "1"
    env["NO_COLOR"] = "1"
    return env


def missing_programs(text: str) -> list[str]:
    """The programs a page's ``<!-- docs-test: needs: ... -->`` markers name that its
    commands would not find on ``PATH``."""
    named: list[str] = []
    fence: str | None = None  # a marker shown in a block (the how-to's) is no marker
    for line in text.splitlines():
        m = FENCE.match(line)
        if m and fence is None:
            fence = m.group("fence")
        elif (
            fence is not None and line.strip().startswith(fence) and set(line.strip()) == {fence[0]}
        ):
            fence = None
        elif fence is None and (needs := NEEDS.match(line)):
            named += needs.group(1).split()
    path = shell_env()["PATH"]
    return [p for p in named if shutil.which(p, path=path) is None]


# ``cmd  # exit code 1``: a command meant to fail, and the code it must fail with
EXPECTED_EXIT = re.compile(r"^(?P<cmd>.*?)[ \t]+#[ \t]*exit code (?P<code>\d+)\b[^\n]*$", re.S)


def expect_exit(command: str) -> str:
    """``cmd  # exit code N`` as a check that ``cmd`` exits with N; other lines as they are."""
    m = EXPECTED_EXIT.match(command)
    if m is None:
        return command
    code = int(m.group("code"))
    return (
        f"__docs_status=0\n{{ {m.group('cmd').strip()}\n}} || __docs_status=$?\n"
        f'if [ "$__docs_status" -ne {code} ]; then'
        f' echo "expected exit code {code}, got $__docs_status" >&2; exit 1; fi'
    )


def shell_script(block: Block) -> str:
    """The bash script a shell or console block runs as."""
    if block.lang in CONSOLE:
        commands: list[str] = []
        cont = False
        for line in block.code.splitlines():
            if line.startswith("$ ") or cont:
                cmd = line[2:] if line.startswith("$ ") and not cont else line
                if cont:
                    commands[-1] += "\n" + cmd
                else:
                    commands.append(cmd)
                cont = cmd.rstrip().endswith("\\")
        body = "\n".join(expect_exit(c) for c in commands)
    else:
        body = "\n".join(expect_exit(line) for line in block.code.splitlines())
    make = re.compile(r"^(\s*)make\s+([\w.-]+)(.*)$", re.M)
    body = make.sub(rf"\1make -n -s -C {REPO} \2 >/dev/null\3", body)
    return "set -euo pipefail\n" + body


def run_shell(block: Block, workdir: Path, cwd: Path, groups: list[int] | None = None) -> Path:
    """Run the block in ``cwd``; returns the directory it ended in. The block runs in a
    process group of its own, with its ``&`` jobs; its id is added to ``groups``, for
    :func:`kill_groups` once the page is done."""
    where = workdir / ".docblocks-cwd"
    script = f"trap 'pwd > {where}' EXIT\n{shell_script(block)}"
    with subprocess.Popen(
        ["bash", "-c", script],
        cwd=cwd,
        env=shell_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        stdin=subprocess.DEVNULL,
        start_new_session=True,  # its own process group: what it leaves running is found
    ) as running:
        if groups is not None:
            groups.append(running.pid)
        try:
            stdout, stderr = running.communicate(timeout=BLOCK_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(running.pid, signal.SIGKILL)  # its bash is alive: the group is its
            running.communicate()
            raise BlockFailed(
                f"{block.where}: still running after {BLOCK_TIMEOUT_S:.0f} s"
            ) from None
    proc = subprocess.CompletedProcess(running.args, running.returncode, stdout, stderr)
    if proc.returncode != 0:
        raise BlockFailed(
            f"{block.where}: {block.lang} block exited {proc.returncode}\n"
            f"--- script\n{shell_script(block)}\n--- stdout\n{proc.stdout[-4000:]}"
            f"\n--- stderr\n{proc.stderr[-4000:]}"
        )
    ended = Path(where.read_text().strip()).resolve()
    if not ended.is_relative_to(workdir.resolve()):
        raise BlockFailed(f"{block.where}: the block left the working directory (for {ended})")
    return ended


def kill_groups(groups: list[int], workdir: Path) -> None:
    """Kill what the shell blocks of a page left running (a server or an agent started
    with ``&``, when a block failed before the page's ``kill``): each process of their
    process groups working in the page's directory. (A group's id alone may name another
    group by now: its leader, the block's bash, is gone and ids are reused.)"""
    proc = Path("/proc")
    if not groups or not proc.is_dir():
        return
    page = workdir.resolve()
    for stat in proc.glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            # after "(command)": state, ppid, process group, ...
            if int(stat.read_text().rsplit(")", 1)[1].split()[2]) not in groups:
                continue
            if Path(os.readlink(stat.parent / "cwd")).is_relative_to(page):
                os.kill(int(stat.parent.name), signal.SIGKILL)


def run_python(block: Block, namespace: dict[str, Any]) -> None:
    filename = f"{block.where} (python block)"
    try:
        code = compile(block.code, filename, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    except SyntaxError as e:
        raise BlockFailed(f"{block.where}: does not compile: {e}") from e
    try:
        result = eval(code, namespace)
        if asyncio.iscoroutine(result):
            asyncio.run(result)
    except BaseException as e:
        if isinstance(e, KeyboardInterrupt):
            raise
        import traceback

        detail = "".join(traceback.format_exception(e))
        raise BlockFailed(f"{block.where}: python block raised\n{detail}") from e


def write_file(block: Block, cwd: Path) -> None:
    assert block.title is not None
    target = cwd / block.title
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(block.code, encoding="utf-8")
    if target.suffix == ".py":
        # checked once as a module of its own name (its __main__ part does not run)
        run_python(block, {"__name__": target.stem, "__file__": str(target)})
    elif target.suffix == ".json":
        check_json(block)


def check_json(block: Block) -> None:
    try:
        json.loads(block.code)
    except ValueError as e:
        raise BlockFailed(f"{block.where}: json block does not parse: {e}") from e


@contextlib.contextmanager
def inside(workdir: Path) -> Iterator[None]:
    """The process's cwd and sys.path are given back after; modules loaded from
    ``workdir`` are forgotten."""
    old_cwd = os.getcwd()
    old_path = list(sys.path)
    # the suite's own helper modules (tests/cli/memory_agents.py, ...) are not in a
    # reader's interpreter: set aside while the page runs, so a page's file of the
    # same name is imported, not the suite's module cached under that name
    suite = str(REPO / "tests") + os.sep
    hidden = {
        n: m
        for n, m in sys.modules.items()
        if "." not in n and (getattr(m, "__file__", None) or "").startswith(suite)
    }
    for name in hidden:
        del sys.modules[name]
    before = set(sys.modules)
    # a reader's interpreter has the repository's root at most at the end (the editable
    # install's path entry): first, its folders would shadow installed packages of the
    # same names (openai-agents' `agents`), as pytest's own entry for the root does here
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != REPO] + [str(REPO)]
    try:
        yield
    finally:
        os.chdir(old_cwd)
        sys.path[:] = old_path
        for name in set(sys.modules) - before:
            file = getattr(sys.modules[name], "__file__", None) or ""
            if file.startswith(str(workdir)):
                del sys.modules[name]
        sys.modules.update(hidden)


def _enter(cwd: Path) -> None:
    os.chdir(cwd)
    if sys.path[0] != str(cwd):
        sys.path.insert(0, str(cwd))


def run_blocks(blocks: list[Block], workdir: Path) -> list[Block]:
    """Run the blocks in order in ``workdir``; returns the blocks that ran."""
    check(blocks)
    ran: list[Block] = []
    namespace: dict[str, Any] = {"__name__": "__main__"}
    venv = workdir / ".venv"
    if not venv.exists():
        venv.symlink_to(sys.prefix)  # the clone's .venv
    cwd = workdir
    groups: list[int] = []  # the shell blocks' process groups, each killed at the end
    with inside(workdir), contextlib.ExitStack() as cleanup:
        cleanup.callback(kill_groups, groups, workdir)
        for b in blocks:
            if b.skip is not None:
                continue
            _enter(cwd)
            if b.title is not None:
                write_file(b, cwd)
            elif b.lang in PYTHON:
                run_python(b, namespace)
            elif b.lang in SHELL | CONSOLE:
                cwd = run_shell(b, workdir, cwd, groups)
            elif b.lang == "json":
                check_json(b)
            else:
                continue
            ran.append(b)
    return ran


def run_page(path: Path, workdir: Path) -> list[Block]:
    """Every block of the Markdown file ``path``, in order, in ``workdir``."""
    return run_blocks(parse(path.read_text(encoding="utf-8"), path), workdir)

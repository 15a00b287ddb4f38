"""MkDocs hook: the reference pages that are generated from the code at build time.

A page asks for a generated section with a marker on a line of its own::

    <!-- generated: cli -->          every `cardbus` command, from the click group
    <!-- generated: events -->       the event catalogue, from EVENT_TYPES
    <!-- generated: transitions -->  the task-state table, from eventstore.states
    <!-- generated: a2a-states -->   each task state's A2A TaskState
    <!-- generated: speed-table -->  the figures of the last `make bench`, from the committed
                                     docs/explanation/speed-figures.json (no bench runs here)

so none of them can drift from the code. The state tables reuse the renderers
that pin the README's copies (``tests/eventstore/test_states.py``). An unknown
marker fails the build.

The hook also lays out the link tree ``.typecheck/cardbus/<folder>`` (as
``make typecheck-tree`` does) when it is missing: mkdocstrings' griffe reads the
package ``cardbus`` from there, because the installed package maps the repository's
folders with setuptools' package-dir, which a static reader cannot follow.
"""

from __future__ import annotations

import importlib.util
import inspect
import json
import re
from pathlib import Path
from types import ModuleType
from typing import Any

import click
import msgspec

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("agents", "bus", "eventstore", "projections", "tools")
MARKER = re.compile(r"^<!-- generated: ([a-z0-9-]+) -->$", re.M)


def link_tree(root: Path = ROOT) -> None:
    """``.typecheck/cardbus/<folder> -> ../../<folder>`` (the Makefile's typecheck-tree)."""
    tree = root / ".typecheck" / "cardbus"
    tree.mkdir(parents=True, exist_ok=True)
    links = {"__init__.py": "../../__init__.py", "testing": "../../tests/contract"}
    links.update({p: f"../../{p}" for p in PACKAGES})
    for name, target in links.items():
        link = tree / name
        if not link.is_symlink():
            link.symlink_to(target)


def _states_renderers() -> ModuleType:
    """tests/eventstore/test_states.py, whose renderers pin the README's tables."""
    path = ROOT / "tests" / "eventstore" / "test_states.py"
    spec = importlib.util.spec_from_file_location("_cardbus_docs_states", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# -- the CLI -------------------------------------------------------------------------


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _option_row(param: click.Parameter, ctx: click.Context) -> str:
    record = param.get_help_record(ctx)
    if record is None:  # a hidden option
        return ""
    names, help_text = record
    return f"| `{_cell(names)}` | {_cell(help_text)} |"


def _command_section(cmd: click.Command, path: list[str], ctx: click.Context) -> list[str]:
    name = " ".join(path)
    level = "#" * min(len(path) + 1, 6)
    lines = [f"{level} `{name}`", ""]
    if cmd.help:
        lines += [inspect.cleandoc(cmd.help).replace("\b\n", ""), ""]
    pieces = cmd.collect_usage_pieces(ctx)
    lines += [f"Usage: `{name} {' '.join(pieces)}`", ""]
    rows = [r for r in (_option_row(p, ctx) for p in cmd.get_params(ctx)) if r]
    if rows:
        lines += ["| option | what it does |", "|---|---|", *rows, ""]
    if isinstance(cmd, click.Group):
        for sub in cmd.list_commands(ctx):
            subcmd = cmd.get_command(ctx, sub)
            if subcmd is None or subcmd.hidden:
                continue
            subctx = click.Context(subcmd, info_name=sub, parent=ctx)
            lines += _command_section(subcmd, [*path, sub], subctx)
    return lines


def render_cli() -> str:
    """Every command of ``cardbus.tools.cli:cli``, its help, usage and options."""
    from cardbus.tools.cli import cli

    ctx = click.Context(cli, info_name="cardbus")
    lines = _command_section(cli, ["cardbus"], ctx)
    return "\n".join(lines).rstrip() + "\n"


# -- the event catalogue ---------------------------------------------------------------


def _type_name(t: msgspec.inspect.Type) -> str:
    match t:
        case msgspec.inspect.StrType():
            return "str"
        case msgspec.inspect.BoolType():
            return "bool"
        case msgspec.inspect.IntType():
            return "int"
        case msgspec.inspect.FloatType():
            return "float"
        case msgspec.inspect.NoneType():
            return "None"
        case msgspec.inspect.AnyType():
            return "Any"
        case msgspec.inspect.ListType(item_type=item):
            return f"list[{_type_name(item)}]"
        case msgspec.inspect.DictType(key_type=k, value_type=v):
            return f"dict[{_type_name(k)}, {_type_name(v)}]"
        case msgspec.inspect.UnionType(types=types):
            return " | ".join(_type_name(x) for x in types)
        case msgspec.inspect.StructType(cls=cls) | msgspec.inspect.EnumType(cls=cls):
            return str(cls.__name__)
        case msgspec.inspect.LiteralType(values=values):
            return "Literal[" + ", ".join(repr(v) for v in values) + "]"
        case _:
            return type(t).__name__.removesuffix("Type").lower()


def _own_doc(cls: type) -> str:
    doc = cls.__dict__.get("__doc__")
    return " ".join(inspect.cleandoc(doc).split("\n\n")[0].split()) if doc else ""


def render_events() -> str:
    """Every event type: its tag, its class, what it means and its fields."""
    from cardbus.eventstore.events import EVENT_TYPES, TASK_EVENT_TYPES, tag_of

    lines = [
        "| tag | class | stream | meaning |",
        "|---|---|---|---|",
    ]
    sections: list[str] = []
    for cls in EVENT_TYPES:
        tag = tag_of(cls)
        path = f"{cls.__module__}.{cls.__qualname__}"
        doc = _own_doc(cls)  # every event class has one (tests/eventstore/test_states.py)
        stream = "task" if cls in TASK_EVENT_TYPES else "run, agent or other"
        anchor = tag.replace(".", "-").replace("_", "-")
        lines.append(
            f"| [`{tag}`](#{anchor}) | [`{cls.__name__}`][{path}] | {stream} | {_cell(doc)} |"
        )
        info = msgspec.inspect.type_info(cls)
        assert isinstance(info, msgspec.inspect.StructType)
        sections += [f"### `{tag}` {{#{anchor}}}", "", f"[`{path}`][{path}]", ""]
        if doc:
            sections += [doc, ""]
        fields = [f for f in info.fields if f.name != "type"]
        if fields:
            sections += ["| field | type | default |", "|---|---|---|"]
            for f in fields:
                default = "required" if f.required else f"`{_default(f)}`"
                sections.append(f"| `{f.name}` | `{_cell(_type_name(f.type))}` | {default} |")
            sections.append("")
    return "\n".join([*lines, "", "## Each event", "", *sections]).rstrip() + "\n"


def _default(field: msgspec.inspect.Field) -> str:
    if field.default_factory is not msgspec.NODEFAULT:
        try:
            return _cell(repr(field.default_factory()))
        except Exception:
            return "(factory)"
    return _cell(repr(field.default))


# -- the speed table ---------------------------------------------------------------------

SPEED_FIGURES = ROOT / "docs" / "explanation" / "speed-figures.json"


def render_speed_table(path: Path = SPEED_FIGURES) -> str:
    """The table ``make bench`` saved (``bench/summary.py --write``), with its machine and date:
    read from the committed file, so building the docs never runs a benchmark."""
    spec = importlib.util.spec_from_file_location(
        "_cardbus_bench_summary", ROOT / "bench" / "summary.py"
    )
    assert spec and spec.loader
    summary = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(summary)
    return str(summary.render(json.loads(path.read_text(encoding="utf-8"))))


# -- the hook --------------------------------------------------------------------------

RENDERERS: dict[str, Any] = {
    "cli": render_cli,
    "events": render_events,
    "transitions": lambda: _states_renderers().render_transition_table() + "\n",
    "a2a-states": lambda: _states_renderers().render_a2a_table() + "\n",
    "speed-table": render_speed_table,
}


def render(markdown: str, where: str = "") -> str:
    """The page with each ``<!-- generated: NAME -->`` marker replaced by its section."""

    def replace(m: re.Match[str]) -> str:
        name = m.group(1)
        if name not in RENDERERS:
            raise ValueError(f"{where}: unknown generated section {name!r}")
        return str(RENDERERS[name]())

    return MARKER.sub(replace, markdown)


# at import: MkDocs imports hooks while it reads its config, before mkdocstrings looks
# for the package
link_tree()


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    return render(markdown, page.file.src_path)

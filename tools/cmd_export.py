"""``cardbus export``: send past runs to a tracing backend, rebuilt from the log alone.

The spans come from ``projections.traces`` (recorded times, deterministic
ids); this command only reads the log and hands them to an SDK exporter:
OTLP/HTTP protobuf (``--otlp URL``, needs ``opentelemetry-exporter-otlp-proto-http``,
the ``otlp`` extra) or the console (``--console``).
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit

import click

from cardbus.eventstore import Envelope, EventStore
from cardbus.eventstore import events as ev
from cardbus.eventstore.errors import StreamNotFound, ValidationError
from cardbus.projections import resolve_id
from cardbus.projections.lineage import read_tree
from cardbus.projections.traces import SpanRecord, agent_names_from, to_readable_spans, trace_spans
from cardbus.tools.cli import cli
from cardbus.tools.cmd_inspect import echo_json, json_option, open_store, run
from cardbus.tools.store_option import StoreRef, store_option

__all__ = ["collect_spans", "otlp_traces_url", "parse_since"]

_MISSING_OTLP = (
    "OTLP export needs the opentelemetry-exporter-otlp-proto-http package: "
    "pip install 'cardbus[otlp]'"
)
_BATCH = 512


def otlp_traces_url(url: str) -> str:
    """``http://host:4318`` -> ``http://host:4318/v1/traces``; a URL with a path is kept."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise click.BadParameter(f"{url!r} is not an http(s) URL", param_hint="--otlp")
    if parts.path in ("", "/"):
        return url.rstrip("/") + "/v1/traces"
    return url


def _env_endpoint() -> str | None:
    traces = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    if traces:
        return traces
    base = os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    return base.rstrip("/") + "/v1/traces" if base else None


def parse_since(value: str) -> float:
    """Unix seconds, or an ISO 8601 moment (UTC when it names no zone)."""
    try:
        t = float(value)
        if math.isfinite(t):
            return t
    except ValueError:
        pass
    try:
        moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError as e:
        raise ValidationError(f"--since {value!r}: not unix seconds nor an ISO 8601 time") from e
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()


async def _read_everything(store: EventStore) -> list[Envelope]:
    out: list[Envelope] = []
    position = 0
    while True:
        page = await store.read_all(position, 5000)
        out.extend(page)
        if len(page) < 5000:
            return out
        position = page[-1].position + 1


async def _agent_names(store: EventStore, events: Sequence[Envelope]) -> dict[str, str]:
    ids = {e.data.agent_id for e in events if isinstance(e.data, ev.TaskDispatched)}
    found: list[Envelope] = []
    for agent_id in sorted(ids):
        found.extend(await store.read_stream(f"agent-{agent_id}"))
    return agent_names_from(found)


async def collect_spans(
    store: EventStore,
    task_id: str | None,
    whole_root: bool = False,
    everything: bool = False,
    since: float | None = None,
) -> list[SpanRecord]:
    """The spans to export: one task (and subtasks), its whole run, or every run."""
    if task_id is not None and not everything:
        own = await store.read_stream(task_id)
        if not own:
            raise StreamNotFound(task_id)
        root_id = own[0].correlation_id
        events = await read_tree(store, root_id)  # with its child runs: one tree
        names = await _agent_names(store, events)
        only = None if whole_root or task_id == root_id else task_id
        spans = trace_spans(events, names, task_id=only)
        return [s for s in spans if since is None or s.start >= since or s.end >= since]
    events = await _read_everything(store)
    names = agent_names_from(events)
    if since is not None:
        roots = {
            e.correlation_id
            for e in events
            if isinstance(e.data, (ev.RunStarted, ev.TaskCreated)) and e.recorded_at >= since
        }
        events = [e for e in events if e.correlation_id in roots]
    return trace_spans(events, names)


def _resource() -> Any:
    from opentelemetry.sdk.resources import Resource

    # Resource.create reads OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES.
    attrs = {} if os.environ.get("OTEL_SERVICE_NAME") else {"service.name": "cardbus"}
    return Resource.create(attrs)


def _exporter(otlp: str | None, console: bool, timeout: float, as_json: bool) -> list[Any]:
    exporters: list[Any] = []
    if console:
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        # with --json the summary is stdout's one document; the spans go to stderr
        exporters.append(ConsoleSpanExporter(out=sys.stderr if as_json else sys.stdout))
    if otlp is not None:
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        except ImportError as e:
            raise click.ClickException(_MISSING_OTLP) from e
        exporters.append(OTLPSpanExporter(endpoint=otlp, timeout=timeout))
    return exporters


@cli.command("export")
@click.argument("task_id", required=False)
@click.option("--otlp", "otlp", metavar="URL", help="OTLP/HTTP endpoint (http://host:4318).")
@click.option("--console", is_flag=True, help="Print the spans as JSON instead (or as well).")
@click.option("--root", "whole_root", is_flag=True, help="Export the task's whole run.")
@click.option("--all", "everything", is_flag=True, help="Export every run in the log.")
@click.option(
    "--since", default=None, metavar="TIME", help="Only runs started at or after this moment."
)
@click.option("--timeout", default=10.0, show_default=True, help="Seconds per OTLP request.")
@store_option
@json_option
def export_cmd(
    task_id: str | None,
    otlp: str | None,
    console: bool,
    whole_root: bool,
    everything: bool,
    since: str | None,
    timeout: float,
    db: StoreRef,
    as_json: bool,
) -> None:
    """Send a task's spans (or a run's, or every run's) to a tracing backend, from the log.

    Ids are derived from event ids, so exporting the same run again yields the
    same trace and span ids. TASK_ID may be a plan id or a unique prefix.
    Without --otlp or --console the standard OTEL_EXPORTER_OTLP_TRACES_ENDPOINT
    / OTEL_EXPORTER_OTLP_ENDPOINT is used. --json prints {"spans": N,
    "traces": [...], "endpoint": URL} on stdout.
    """
    if task_id is None and not everything and since is None:
        raise click.UsageError("give a TASK_ID, --all or --since")
    if otlp is not None:
        otlp = otlp_traces_url(otlp)
    elif not console:
        otlp = _env_endpoint()
        if otlp is None:
            raise click.UsageError(
                "give --otlp URL or --console (or set OTEL_EXPORTER_OTLP_ENDPOINT)"
            )
    exporters = _exporter(otlp, console, timeout, as_json)
    moment = parse_since(since) if since is not None else None

    async def go() -> list[SpanRecord]:
        store = await open_store(db)
        try:
            chosen = None if task_id is None else await resolve_id(store, task_id)
            return await collect_spans(store, chosen, whole_root, everything, moment)
        finally:
            await store.close()

    records = run(go())
    spans = to_readable_spans(records, _resource())
    from opentelemetry.sdk.trace.export import SpanExportResult

    failed = False
    for exporter in exporters:
        try:
            for i in range(0, len(spans), _BATCH):
                if exporter.export(spans[i : i + _BATCH]) is not SpanExportResult.SUCCESS:
                    failed = True
                    break
        finally:
            exporter.shutdown()
    traces = {r.trace_id for r in records}
    where = f" to {otlp}" if otlp else ""
    if failed:
        raise click.ClickException(f"export of {len(spans)} spans{where} failed")
    if as_json:
        ids = [f"{t:032x}" for t in sorted(traces)]
        echo_json({"spans": len(spans), "traces": ids, "endpoint": otlp})
        return
    click.echo(f"exported {len(spans)} spans in {len(traces)} traces{where}", err=True)
    for trace_id in sorted(traces):
        click.echo(f"trace {trace_id:032x}", err=True)

"""The NATS commands: ``agent serve``, ``orchestrator``, ``nats replay``/``nats dead``,
and the distributed ``demo`` (``cardbus demo --nats URL`` / ``--start-nats``).

Every command takes ``--nats URL`` (a comma-separated list for a cluster) and
the connection options shared by the bus and the event store
(``cardbus.eventstore.nats.connection``): ``--nats-token``,
``--nats-user``/``--nats-password``, ``--nats-nkey`` (seed file), ``--nats-creds``,
``--tls-ca``/``--tls-cert``/``--tls-key``, each also read from its
``CARDBUS_NATS_*`` variable (``ENV_VARS`` there). Reconnects go on forever with
backoff.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import click
import msgspec

from cardbus.agents.agent import Agent
from cardbus.agents.mcp_config import MCPServer, split_plan_servers
from cardbus.agents.tools import ToolRegistry, doc_search_tool
from cardbus.bus.orchestrator.plan import as_plan, decode_plan
from cardbus.bus.orchestrator.policy import Policy
from cardbus.bus.orchestrator.registry import AgentGrants
from cardbus.bus.runtime.loop import run as run_loop
from cardbus.bus.runtime.nats import LocalNatsServer, NatsRuntime, agent_inbox_prefix, serve_agents
from cardbus.bus.transport.nats import (
    DEAD_STREAM,
    ORCHESTRATOR_DURABLE,
    REASON_HEADER,
    SUBJECT_HEADER,
    agent_permissions,
    header,
    orchestrator_permissions,
)
from cardbus.eventstore import EventStore, SqliteEventStore, new_id
from cardbus.eventstore.nats.connection import ENV_VARS, NatsOptions
from cardbus.tools.cli import cli
from cardbus.tools.errors import EXIT_FAILED
from cardbus.tools.llm_options import close_llm, llm_options, open_llm, watch_model_calls
from cardbus.tools.loading import load_agent
from cardbus.tools.mcp_options import mcp_options, mcp_servers
from cardbus.tools.outcome import run_events, run_line, see_through

F = TypeVar("F", bound=Callable[..., Any])

_CONN = ("token", "user", "password", "nkey", "creds", "tls_ca", "tls_cert", "tls_key")


def nats_options(func: F) -> F:
    """``--nats URL`` and the connection options, gathered into ``conn: NatsOptions``."""
    opts = [
        click.option(
            "--nats",
            "nats_url",
            envvar=ENV_VARS["url"],
            show_envvar=True,
            default="nats://127.0.0.1:4222",
            show_default=True,
            help="NATS server URL(s), comma-separated for a cluster.",
        ),
        click.option(
            "--nats-token", "token", envvar=ENV_VARS["token"], show_envvar=True, help="Auth token."
        ),
        click.option(
            "--nats-user", "user", envvar=ENV_VARS["user"], show_envvar=True, help="User name."
        ),
        click.option("--nats-password", "password", envvar=ENV_VARS["password"], show_envvar=True),
        click.option(
            "--nats-nkey",
            "nkey",
            envvar=ENV_VARS["nkeys_seed"],
            show_envvar=True,
            help="Nkey seed file.",
        ),
        click.option(
            "--nats-creds",
            "creds",
            envvar=ENV_VARS["user_credentials"],
            show_envvar=True,
            help=".creds file.",
        ),
        click.option(
            "--tls-ca", envvar=ENV_VARS["tls_ca"], show_envvar=True, help="CA bundle for TLS."
        ),
        click.option(
            "--tls-cert", envvar=ENV_VARS["tls_cert"], show_envvar=True, help="Client certificate."
        ),
        click.option("--tls-key", envvar=ENV_VARS["tls_key"], show_envvar=True, help="Client key."),
    ]
    for o in reversed(opts):
        func = o(func)
    return func


def build_options(nats_url: str, kw: dict[str, Any], **extra: Any) -> NatsOptions:
    """Pop the connection options of :func:`nats_options` from ``kw`` into NatsOptions."""
    given = {k: kw.pop(k, None) for k in _CONN}
    return NatsOptions(
        url=nats_url,
        token=given["token"],
        user=given["user"],
        password=given["password"],
        nkeys_seed=given["nkey"],
        user_credentials=given["creds"],
        tls_ca=given["tls_ca"],
        tls_cert=given["tls_cert"],
        tls_key=given["tls_key"],
        **extra,
    )


def _bus_options(ack_wait: float, max_deliver: int, stream_replicas: int) -> dict[str, Any]:
    return {"ack_wait": ack_wait, "max_deliver": max_deliver, "replicas": stream_replicas}


_ack_wait = click.option(
    "--ack-wait",
    default=30.0,
    show_default=True,
    help="Seconds a replica may hold a card without an in-progress ack before it is redelivered.",
)
_max_deliver = click.option(
    "--max-deliver",
    default=5,
    show_default=True,
    help="Deliveries of a card before it is dead-lettered.",
)
_stream_replicas = click.option(
    "--stream-replicas",
    default=1,
    show_default=True,
    help="JetStream replicas of the streams cardbus creates (3 on a 3-node cluster).",
)


def _until_signal(stop: asyncio.Event) -> None:
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)


# -- cardbus agent serve ------------------------------------------------------------


@cli.group()
def agent() -> None:
    """Agents as separate processes on NATS."""


@agent.command("serve")
@click.argument("agent_paths", nargs=-1, required=True)
@nats_options
@click.option("--replicas", default=1, show_default=True, help="Consumers (connections) to run.")
@click.option(
    "--concurrency",
    type=int,
    default=None,
    help="Cards at once per replica (default: each agent's max_concurrency).",
)
@click.option(
    "--inbox-prefix",
    default=None,
    help="Reply-subject prefix of the connection (default _INBOX.<agent id>, see README).",
)
@_ack_wait
@_max_deliver
@_stream_replicas
@llm_options
@mcp_options
def agent_serve(
    agent_paths: tuple[str, ...],
    nats_url: str,
    replicas: int,
    concurrency: int | None,
    inbox_prefix: str | None,
    ack_wait: float,
    max_deliver: int,
    stream_replicas: int,
    llm_base_url: str | None = None,
    model: str | None = None,
    mcp: tuple[str, ...] = (),
    mcp_config: tuple[str, ...] = (),
    **kw: Any,
) -> None:
    """Serve AGENT_PATHS (module:AgentClass ...) from this process, on NATS.

    The tools the agents declare as Tool objects run in this process, and so do
    the tools of the MCP servers --mcp / --mcp-config mount here (NAME__<tool>,
    for the agents whose allow-list has them); their schemas are offered to the
    models. A tool an agent declares by name alone is the orchestrator's to
    serve (`cardbus orchestrator --mcp ...`).

    Every replica pulls from the agent's shared inbox, so start as many
    processes (or --replicas) as you like: each card goes to one of them, and
    a card whose replica dies is redelivered to another after --ack-wait.
    """
    agents = [load_agent(p) for p in agent_paths]
    options = build_options(nats_url, kw, inbox_prefix=inbox_prefix or agent_inbox_prefix(agents))
    servers = mcp_servers(mcp, mcp_config)

    async def go() -> None:
        stop = asyncio.Event()
        _until_signal(stop)
        ready = asyncio.Event()
        llm = open_llm(llm_base_url, model, agents)
        serving = asyncio.ensure_future(
            serve_agents(
                options,
                agents,
                stop,
                replicas=replicas,
                concurrency=concurrency,
                llm=llm,
                bus_options=_bus_options(ack_wait, max_deliver, stream_replicas),
                ready=ready,
                mcp_servers=servers,
            )
        )
        try:
            waiter = asyncio.ensure_future(ready.wait())
            await asyncio.wait([serving, waiter], return_when=asyncio.FIRST_COMPLETED)
            if ready.is_set():
                ids = ", ".join(a.agent_id for a in agents)
                click.echo(f"serving {ids} ({replicas} replica(s)) on {nats_url}")
                sys.stdout.flush()
            else:
                waiter.cancel()
            await serving
        finally:
            await close_llm(llm)

    run_loop(go())


@agent.command("check")
@nats_options
@click.option("--agent", "agent_id", required=True, help="The id of the running agent to check.")
@click.option("--capability", default=None, help="The capability of the card it must take.")
@click.option(
    "--inputs",
    "inputs_json",
    default=None,
    help="That card's inputs as JSON (default: from the capability's input schema).",
)
@click.option("--timeout", default=30.0, show_default=True, help="Seconds to wait for each answer.")
@click.option("--json", "as_json", is_flag=True, help="The report as JSON.")
def agent_check(
    nats_url: str,
    agent_id: str,
    capability: str | None,
    inputs_json: str | None,
    timeout: float,
    as_json: bool,
    **kw: Any,
) -> None:
    """Check a running agent, in any language, against the wire contract.

    Plays the orchestrator (run it where none serves the agent): a card it can take, one
    it cannot, the first again (a redelivery); its announcement and renewal; what it
    sent. Prints pass, fail or not exercised per clause; exits 1 if one failed.
    """
    from cardbus.bus.conformance import check_agent

    try:
        inputs = None if inputs_json is None else json.loads(inputs_json)
    except ValueError as e:
        raise click.BadParameter(f"not JSON: {e}", param_hint="--inputs") from e
    options = build_options(nats_url, kw)
    report = run_loop(
        check_agent(options, agent_id, capability=capability, inputs=inputs, timeout=timeout)
    )
    if as_json:
        click.echo(json.dumps(report.as_json()))
    else:
        for line in report.lines():
            click.echo(line)
    if not report.passed:
        sys.exit(EXIT_FAILED)


# -- cardbus orchestrator -------------------------------------------------------------


@cli.command()
@nats_options
@click.option("--db", default=None, help="SQLite event store file (default: the log on NATS).")
@click.option("--plan", "plan_file", default=None, type=click.Path(exists=True, dir_okay=False))
@click.option("--timeout", default=600.0, show_default=True, help="Seconds to wait for --plan.")
@click.option("--json", "as_json", is_flag=True, help="Print the --plan result as JSON.")
@click.option("--agent-timeout", default=30.0, show_default=True, help="Wait for agents (s).")
@click.option(
    "--consumer",
    default=ORCHESTRATOR_DURABLE,
    show_default=True,
    help="Durable reply consumer; give each orchestrator on the same log its own.",
)
@click.option(
    "--docs",
    default=None,
    type=click.Path(exists=True, file_okay=False),
    help="Serve agents the doc_search tool over this folder.",
)
@click.option(
    "--agents",
    "agents_file",
    default=None,
    envvar="CARDBUS_AGENTS_FILE",
    show_envvar=True,
    type=click.Path(exists=True, dir_okay=False),
    help="The operator's agents file (a JSON list of AgentCards): only these agents may"
    " register, with at most these capabilities, tools and limits. Default: open (each"
    " agent's first card is its ceiling).",
)
@click.option(
    "--partitions",
    type=int,
    default=None,
    help="Share the runs with the other orchestrators started with the same count: each"
    " decides the runs of the partitions it holds a lease on (NATS KV bucket cardbus-owners)"
    " and takes over a dead one's after --partition-lease. Default: this one decides all.",
)
@click.option(
    "--partition-lease",
    default=6.0,
    show_default=True,
    help="Seconds a partition's lease lasts unrenewed (the same for every orchestrator).",
)
@click.option(
    "--member",
    default=None,
    help="This orchestrator's name among the --partitions ones (default: new each start);"
    " it names its reply consumer unless --consumer does.",
)
@click.option(
    "--schedule-grace",
    default=10.0,
    show_default=True,
    help="Seconds a schedule's due time may be late and still fire on time; later, it is"
    " a missed one and follows the schedule's catch-up policy.",
)
@_ack_wait
@_max_deliver
@_stream_replicas
@llm_options
@mcp_options
def orchestrator(
    nats_url: str,
    db: str | None,
    plan_file: str | None,
    timeout: float,
    as_json: bool,
    agent_timeout: float,
    consumer: str,
    docs: str | None,
    agents_file: str | None,
    partitions: int | None,
    partition_lease: float,
    member: str | None,
    schedule_grace: float,
    ack_wait: float,
    max_deliver: int,
    stream_replicas: int,
    llm_base_url: str | None = None,
    model: str | None = None,
    mcp: tuple[str, ...] = (),
    mcp_config: tuple[str, ...] = (),
    **kw: Any,
) -> None:
    """Run the orchestrator on NATS; it resumes every open run from the log.

    Without --plan it serves until stopped (Ctrl-C / SIGTERM). With --plan it
    submits that plan, waits for it and exits (0: it completed; 1: it did not,
    and the last line names the task that failed it; 124: --timeout passed,
    and the run is cancelled, reason client_timed_out); a plan whose plan_id
    is already in the log is resumed, not started again. Several orchestrators may run
    on the same log: optimistic concurrency keeps each task's stream
    consistent; with --partitions they share the work instead of all deciding
    every run.
    """
    options = build_options(nats_url, kw)
    plan_data, plan_servers = (
        split_plan_servers(Path(plan_file).read_bytes()) if plan_file else (b"", [])
    )
    plan = decode_plan(plan_data) if plan_file else None
    if plan is not None:  # the run is found in the log by its plan id (after a timeout)
        plan = msgspec.structs.replace(plan, plan_id=plan.plan_id or new_id())
    grants = AgentGrants.load(agents_file) if agents_file else None
    servers = mcp_servers(mcp, mcp_config, plan_servers)

    async def go() -> int:
        llm = open_llm(llm_base_url, model)  # for any agent the runtime runs in-process
        store: EventStore | None = await SqliteEventStore.open(db) if db else None
        try:
            async with NatsRuntime(
                options,
                store=store,
                llm=llm,
                bus_options={
                    **_bus_options(ack_wait, max_deliver, stream_replicas),
                    "reply_durable": consumer,
                },
                store_options={"replicas": stream_replicas},
                tools=ToolRegistry([doc_search_tool(docs)]) if docs else None,
                mcp_servers=servers,
                grants=grants,
                partitions=partitions,
                partition_lease_s=partition_lease,
                member=member,
                scheduler_options={"grace": schedule_grace},
            ) as rt:
                if plan is None:
                    stop = asyncio.Event()
                    _until_signal(stop)
                    open_runs = len(rt.orchestrator.state.open)
                    click.echo(f"orchestrator on {nats_url}: {open_runs} open run(s) resumed")
                    sys.stdout.flush()
                    await stop.wait()
                    return 0
                result = await see_through(
                    rt.run(plan, timeout, agent_timeout),
                    rt.store,
                    timeout,
                    "cardbus orchestrator --plan",
                    plan_id=plan.plan_id,
                    orchestrator=rt.orchestrator,
                    store_flag=f" --store {db or nats_url}",
                )
                events = [] if result.status == "completed" else await run_events(rt.store, result)
            _print_result(result, as_json, events)
            return 0 if result.status == "completed" else EXIT_FAILED
        finally:
            if store is not None:
                await store.close()
            await close_llm(llm)

    raise SystemExit(run_loop(go()))


def _print_result(result: Any, as_json: bool, events: list[Any]) -> None:
    from cardbus.tools.cmd_demo import result_json

    if as_json:
        click.echo(json.dumps(result_json(result, events)))
    else:
        click.echo(run_line(result, events))


# -- cardbus nats replay / dead ------------------------------------------------------


@cli.group("nats")
def nats_group() -> None:
    """Inspect a cardbus log and its dead letters on NATS."""


@nats_group.command("replay")
@click.argument("root_id")
@nats_options
@click.option("--json", "as_json", is_flag=True, help="The timeline as JSON.")
def nats_replay(root_id: str, nats_url: str, as_json: bool, **kw: Any) -> None:
    """Deprecated: use `cardbus replay ID --store nats://HOST:PORT` (the same timeline).

    Kept as an alias; it prints the same as `cardbus replay`.
    """
    from cardbus.tools.cmd_replay import show_replay
    from cardbus.tools.store_option import StoreRef

    click.echo(
        f"cardbus nats replay is deprecated: use cardbus replay {root_id} --store {nats_url}",
        err=True,
    )
    options = build_options(nats_url, kw)
    given = {k: getattr(options, k) for k in ENV_VARS if k != "url" and getattr(options, k)}
    show_replay(root_id, StoreRef(nats_url, "nats", None, given), as_json, None, None)


@nats_group.command("dead")
@nats_options
@click.option("--limit", default=100, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="One JSON list of the dead letters.")
def nats_dead(nats_url: str, limit: int, as_json: bool, **kw: Any) -> None:
    """List dead letters: malformed, oversized or undeliverable messages, with the reason."""
    options = build_options(nats_url, kw)

    async def go() -> list[dict[str, Any]]:
        nc = await options.connect("cardbus-dead")
        try:
            js = nc.jetstream()
            sub = await js.pull_subscribe("cardbus.dead.>", stream=DEAD_STREAM)
            found: list[dict[str, Any]] = []
            with contextlib.suppress(Exception):
                while len(found) < limit:
                    for m in await sub.fetch(min(100, limit - len(found)), timeout=0.5):
                        found.append(
                            {
                                "sequence": m.metadata.sequence.stream,
                                "subject": header(m, SUBJECT_HEADER),
                                "bytes": len(m.data),
                                "reason": header(m, REASON_HEADER),
                            }
                        )
            return found
        finally:
            await nc.close()

    found = asyncio.run(go())
    if as_json:
        click.echo(json.dumps(found))
        return
    lines = [f"{d['sequence']}  {d['subject']}  {d['bytes']} bytes  {d['reason']}" for d in found]
    click.echo("\n".join(lines) if lines else "no dead letters")


@nats_group.command("permissions")
@click.option("--agent", "agent_ids", multiple=True, help="An agent id (one user each).")
@click.option("--password", default="CHANGE-ME", show_default=True, help="Placeholder password.")
@click.option("--json", "as_json", is_flag=True, help="Each user's permissions as JSON instead.")
def nats_permissions(agent_ids: tuple[str, ...], password: str, as_json: bool) -> None:
    """Print a nats-server authorization block: one user per role, least privilege."""
    if as_json:
        users = {"orchestrator": orchestrator_permissions()}
        users.update({f"agent-{a}": agent_permissions(a) for a in agent_ids})
        click.echo(json.dumps(users))
        return
    click.echo(authorization_config(agent_ids, password))


def authorization_config(agent_ids: Sequence[str], password: str) -> str:
    """The ``authorization { users: [...] }`` block for the orchestrator and each agent."""
    users = [("orchestrator", orchestrator_permissions())]
    users += [(f"agent-{a}", agent_permissions(a)) for a in agent_ids]
    lines = ["authorization {", "  users: ["]
    for name, perms in users:
        lines.append(f"    {{ user: {json.dumps(name)}, password: {json.dumps(password)},")
        lines.append("      permissions: {")
        if name == "orchestrator":
            lines.append("        allow_responses: true")
        for kind in ("publish", "subscribe"):
            quoted = ", ".join(json.dumps(x) for x in perms[kind])
            lines.append(f"        {kind}: {{ allow: [{quoted}] }}")
        lines.append("      } }")
    lines += ["  ]", "}"]
    return "\n".join(lines)


# -- cardbus demo --nats / --start-nats (the branch at the start of `demo`) -------------


@contextlib.asynccontextmanager
async def _temporary(folder: tempfile.TemporaryDirectory[str]) -> AsyncIterator[str]:
    from cardbus.agents.demo.docs import demo_docs_folder

    try:
        yield str(demo_docs_folder(folder))
    finally:
        folder.cleanup()


@contextlib.asynccontextmanager
async def _closing_llm(llm: Any) -> AsyncIterator[None]:
    try:
        yield
    finally:
        if llm is not None:
            await close_llm(llm)


def demo_on_nats(
    nats_url: str | None,
    start_nats: bool,
    parallel: bool,
    topic: str,
    external_agents: bool,
    as_json: bool = False,
    llm_base_url: str | None = None,
    model: str | None = None,
    mcp_servers: Sequence[MCPServer] = (),
    timeout: float = 120.0,
) -> int:
    """The demo with the orchestrator in this process, on NATS.

    The demo agents are served in this process too (on their own connection),
    unless ``external_agents``: then they must be served by ``cardbus agent
    serve`` processes. With ``start_nats`` a local nats-server with a temporary
    store is started for the run and stopped after it.
    """
    from cardbus.agents.demo import DEMO_AGENTS, demo_docs, parallel_plan, report_plan
    from cardbus.tools.cmd_demo import report_text, result_json, timeline_text

    plan = as_plan(parallel_plan(topic) if parallel else report_plan(topic))
    plan = msgspec.structs.replace(plan, plan_id=plan.plan_id or new_id())  # found by it
    agents: list[type[Agent]] = [] if external_agents else list(DEMO_AGENTS)

    async def go(url: str) -> int:
        from cardbus.projections.replay import replay

        started = time.perf_counter()
        # its own reply consumer, so an orchestrator already serving the log sees every reply too
        bus_options = {
            "reply_durable": f"cardbus-demo-{os.getpid()}",
            "delete_reply_consumer": True,
        }
        llm = open_llm(llm_base_url, model) if agents else None
        # the researcher's doc_search over the demo documents, as on the embedded default
        async with (
            _closing_llm(llm),
            _temporary(demo_docs()) as docs,
            NatsRuntime(
                NatsOptions(url=url),
                agents,
                policy=Policy(),
                llm=llm,
                bus_options=bus_options,
                tools=ToolRegistry([doc_search_tool(docs)]),
                mcp_servers=mcp_servers,
            ) as rt,
        ):
            watch_model_calls(rt.orchestrator, llm)
            result = await see_through(
                rt.run(plan, timeout=timeout),
                rt.store,
                timeout,
                "cardbus demo --nats",
                plan_id=plan.plan_id,
                orchestrator=rt.orchestrator,
                store_flag=f" --store {url}",
            )
            elapsed = time.perf_counter() - started
            events = [] if result.status == "completed" else await run_events(rt.store, result)
            if as_json:
                click.echo(json.dumps(result_json(result, events)))
                return 0 if result.status == "completed" else 1
            click.echo(report_text(result.outputs.get("draft")))
            click.echo("")
            click.echo(f"Timeline of run {result.root_id} ({result.status}, {elapsed:.2f} s):")
            click.echo(timeline_text(await replay(rt.store, result.root_id)))
        click.echo("")
        if not start_nats:
            click.echo(f"The log is on NATS. Try: cardbus replay {result.root_id} --store {url}")
        if result.status != "completed":
            click.echo(run_line(result, events))
        return 0 if result.status == "completed" else 1

    if start_nats:
        with LocalNatsServer() as server:
            click.echo(f"started nats-server on {server.url} (temporary store)", err=as_json)
            return run_loop(go(server.url))
    assert nats_url is not None
    return run_loop(go(nats_url))

"""The one NATS connection module: options and their environment variables, the error
translation at the boundary, store retries of transient errors (no server needed)."""

from __future__ import annotations

import asyncio
import inspect
import socket

import nats.errors
import nats.js.errors
import pytest
from nats.js import api as js_api

from cardbus.eventstore.errors import (
    BusError,
    ConcurrencyError,
    PayloadTooLarge,
    StoreError,
    StoreUnavailable,
    ValidationError,
)
from cardbus.eventstore.nats import NatsEventStore, wire
from cardbus.eventstore.nats.connection import (
    ENV_VARS,
    NatsOptions,
    connect,
    is_transient,
    reconnect_backoff,
    retry_transient,
    server_list,
    transient,
    translated,
)


def api_error(code: int, err_code: int | None = None) -> nats.js.errors.APIError:
    """The error nats-py raises for a JetStream API answer with this code."""
    try:
        nats.js.errors.APIError.from_error({"code": code, "err_code": err_code, "description": "x"})
    except nats.js.errors.APIError as e:
        return e
    raise AssertionError("from_error always raises")


# -- options and environment variables ---------------------------------------------------


def test_every_environment_variable_fills_its_option() -> None:
    env = {var: f"value-of-{name}" for name, var in ENV_VARS.items()}
    opts = NatsOptions.from_env(env=env)
    for name in ENV_VARS:
        assert getattr(opts, name) == f"value-of-{name}", name


def test_given_values_win_over_the_environment_and_empty_variables_are_unset() -> None:
    env = {"CARDBUS_NATS_USER": "from-env", "CARDBUS_NATS_TOKEN": "", "CARDBUS_NATS_URL": "x"}
    opts = NatsOptions.from_env("nats://h:1", env=env, user="given", password=None)
    assert (opts.url, opts.user, opts.token, opts.password) == ("nats://h:1", "given", None, None)


def test_the_cli_reads_the_same_environment_variables() -> None:
    from cardbus.tools.cmd_nats import nats_replay

    read = {p.envvar for p in nats_replay.params if getattr(p, "envvar", None)}
    assert read == set(ENV_VARS.values())


def test_store_kwargs_are_keywords_of_the_store_connect() -> None:
    accepted = set(inspect.signature(NatsEventStore.connect).parameters)
    kwargs = NatsOptions(url="nats://h:1", user="u").store_kwargs()
    assert "inbox_prefix" not in kwargs  # only passed on to nats.connect when set
    assert set(kwargs) <= accepted
    assert NatsOptions(inbox_prefix="_INBOX.a").store_kwargs()["inbox_prefix"] == "_INBOX.a"


def test_connect_kwargs_hold_only_what_is_set() -> None:
    kw = NatsOptions(
        url="nats://a:1, nats://b:2", token="t", inbox_prefix="_INBOX.x"
    ).connect_kwargs("me")
    assert kw["servers"] == ["nats://a:1", "nats://b:2"]
    assert (kw["name"], kw["token"], kw["inbox_prefix"]) == ("me", "t", "_INBOX.x")
    assert not {"user", "password", "nkeys_seed", "user_credentials", "tls"} & set(kw)


def test_server_list_takes_commas_and_sequences_and_refuses_none() -> None:
    assert server_list(" nats://a:1 ,nats://b:2,") == ["nats://a:1", "nats://b:2"]
    assert server_list(["nats://a:1"]) == ["nats://a:1"]
    with pytest.raises(ValidationError):
        server_list(" , ")


def test_reconnect_backoff_grows_to_its_cap_with_jitter() -> None:
    class Server:
        def __init__(self, reconnects: int) -> None:
            self.reconnects = reconnects

    choose = reconnect_backoff(0.25, 5.0)
    fresh, tried = Server(0), Server(3)
    assert choose([tried, fresh], {}) == (fresh, 0.0)  # the least tried server, at once
    assert 0.8 * 1.0 <= choose([tried], {})[1] <= 1.2 * 1.0  # 0.25 * 2**2
    assert 0.8 * 5.0 <= choose([Server(40)], {})[1] <= 1.2 * 5.0


async def test_a_server_nobody_listens_on_is_the_callers_error() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    opts = NatsOptions(url=f"nats://127.0.0.1:{port}", connect_timeout=0.5)
    with pytest.raises(BusError, match=r"cannot connect to NATS at nats://127\.0\.0\.1"):
        await opts.connect("test")
    with pytest.raises(StoreUnavailable, match="cannot connect") as info:
        await connect(opts, "test")
    assert not is_transient(info.value)  # a failed first connect is not retried


# -- error translation -----------------------------------------------------------------------


def translate(e: BaseException, **kwargs: object) -> BaseException:
    with pytest.raises(BaseException) as info, translated("doing it", **kwargs):  # type: ignore[arg-type]
        raise e
    return info.value


@pytest.mark.parametrize(
    ("raised", "expected"),
    [
        (nats.errors.TimeoutError(), StoreUnavailable),
        (nats.errors.NoRespondersError(), StoreUnavailable),
        (nats.errors.ConnectionClosedError(), StoreUnavailable),
        (ConnectionResetError(), StoreUnavailable),
        (api_error(503), StoreUnavailable),
        (api_error(500), StoreUnavailable),
        (api_error(400, 10058), StoreError),
        (api_error(404, 10037), StoreError),
    ],
)
def test_nats_errors_become_ours_with_the_cause(raised: BaseException, expected: type) -> None:
    got = translate(raised)
    assert type(got) is expected
    assert got.__cause__ is raised
    assert str(got).startswith("doing it")


def test_the_error_classes_are_the_callers() -> None:
    assert type(translate(nats.errors.TimeoutError(), error=BusError)) is BusError
    assert type(translate(api_error(400), refused=BusError)) is BusError


def test_too_large_is_named_as_such_where_the_size_is_known() -> None:
    too_large = lambda: PayloadTooLarge(10, 5)  # noqa: E731
    for raised in (nats.errors.MaxPayloadError(), api_error(400, 10054)):
        got = translate(raised, too_large=too_large)
        assert isinstance(got, PayloadTooLarge) and got.__cause__ is raised
    assert type(translate(nats.errors.MaxPayloadError())) is StoreError  # size unknown


def test_our_errors_and_foreign_ones_pass_unchanged() -> None:
    ours = ConcurrencyError("t", 1, 2)
    assert translate(ours) is ours
    bug = ValueError("a bug, not the network")
    assert translate(bug) is bug
    other = ImportError("no module named x", name="x")
    assert translate(other) is other


def test_a_missing_nkeys_package_is_named() -> None:
    got = translate(ImportError("No module named 'nkeys'", name="nkeys"))
    assert isinstance(got, StoreUnavailable) and "pip install nkeys" in str(got)


def test_which_errors_are_transient() -> None:
    assert is_transient(transient("leader election"))
    assert is_transient(nats.errors.TimeoutError())
    assert is_transient(api_error(503))
    assert not is_transient(api_error(400, 10071))
    assert not is_transient(nats.errors.MaxPayloadError())
    assert not is_transient(StoreUnavailable("the event store is closed"))
    assert not is_transient(ValueError())


# -- store retries ----------------------------------------------------------------------------


class Flaky:
    """Fails ``times`` times with ``error``, then answers 42."""

    def __init__(self, times: int, error: BaseException) -> None:
        self.left = times
        self.error = error
        self.calls = 0

    async def __call__(self) -> int:
        self.calls += 1
        if self.left > 0:
            self.left -= 1
            raise self.error
        return 42


async def test_transient_failures_are_tried_again_until_they_pass() -> None:
    op = Flaky(3, transient("reconnecting"))
    assert await retry_transient(op, within=5.0, pause=0.001) == 42
    assert op.calls == 4


async def test_other_failures_are_raised_at_once() -> None:
    op = Flaky(3, ConcurrencyError("t", 1, 2))
    with pytest.raises(ConcurrencyError):
        await retry_transient(op, within=5.0, pause=0.001)
    assert op.calls == 1


async def test_giving_up_raises_a_plain_store_unavailable_with_the_cause() -> None:
    cause = nats.errors.TimeoutError()
    op = Flaky(1000, transient("no ack"))
    op.error.__cause__ = cause
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(StoreUnavailable, match="no ack") as info:
        await retry_transient(op, within=0.05, pause=0.005, max_pause=0.01)
    assert type(info.value) is StoreUnavailable  # the private marker never reaches a caller
    assert info.value.__cause__ is cause
    assert 2 <= op.calls < 100 and loop.time() - started < 1.0


async def test_a_stopped_owner_stops_the_retries() -> None:
    op = Flaky(1000, nats.errors.TimeoutError())
    with pytest.raises(nats.errors.TimeoutError):
        await retry_transient(op, stopped=lambda: op.calls >= 3, pause=0.001)
    assert op.calls == 3


async def test_retry_on_chooses_what_is_tried_again() -> None:
    op = Flaky(2, api_error(404, 10059))  # not transient by default: a stream recovering
    assert await retry_transient(op, retry_on=lambda e: True, pause=0.001) == 42
    assert op.calls == 3


# -- names from nats-py -------------------------------------------------------------------


def test_header_names_agree_with_nats_py() -> None:
    header = js_api.Header
    assert wire.MSG_ID == "Nats-Msg-Id" == header.MSG_ID
    assert wire.EXPECTED_LAST_SUBJECT_SEQUENCE == header.EXPECTED_LAST_SUBJECT_SEQUENCE
    assert (wire.STATUS, wire.DESCRIPTION) == ("Status", "Description")
    # nats-py names the batch headers from 2.16 on; ours must be the same strings
    for ours, name in [
        (wire.BATCH_ID, "BATCH_ID"),
        (wire.BATCH_SEQUENCE, "BATCH_SEQUENCE"),
        (wire.BATCH_COMMIT, "BATCH_COMMIT"),
    ]:
        theirs = getattr(header, name, None)
        assert theirs is None or ours == theirs.value
    assert (wire.HEARTBEAT, wire.NO_MESSAGES, wire.REQUEST_TIMEOUT) == ("100", "404", "408")

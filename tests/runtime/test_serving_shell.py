"""The serving shell's shared pieces (issue 57): one SessionTable (bounded, least recently used
idle session first, each session its owner's), the partition server's sessions on it (another
secret refused), the serve commands' shared flags made from one table, and the shell around a
composed handler."""

from __future__ import annotations

import threading

import grpc
import pytest
import torch
import typer.main

from edgesplit.cli import app
from edgesplit.cli.serve_options import SERVE_FLAGS
from edgesplit.errors import SessionOwnerError, SessionsBusyError
from edgesplit.plan.model import PLAN_VERSION
from edgesplit.runtime.backends import TorchBackend
from edgesplit.runtime.client import ChainClient
from edgesplit.runtime.dataplane import Hop, Message, Part
from edgesplit.runtime.planned import SESSION_KEY
from edgesplit.runtime.server import PartitionHandler
from edgesplit.runtime.sessions import OWNER_KEY, SessionTable, owner_digest
from helpers import server_for
from test_runtime_backends import CountingBackend, program  # noqa: F401  (digits_cnn, cut early)


# ---- SessionTable -------------------------------------------------------------------------------
def test_the_least_recently_used_idle_session_makes_room():
    table: SessionTable[str] = SessionTable(2, device="d")
    table.get_or_open("a", None, lambda: "A")
    table.get_or_open("b", None, lambda: "B")
    table.get_or_open("a", None, lambda: "unused")  # a used again: b is now the oldest
    assert table.get_or_open("c", None, lambda: "C") == "C"
    assert ("a" in table, "b" in table, "c" in table) == (True, False, True)
    assert table.evicted == 1


def test_a_held_session_is_never_evicted_and_a_new_one_waits_then_is_refused():
    table: SessionTable[str] = SessionTable(1, device="d", holds="KV caches")
    with table.held("a", None, lambda: "A"):
        with pytest.raises(SessionsBusyError, match="all 1 KV caches of device 'd'"), \
                table.held("b", None, lambda: "B", wait_s=0):
            pass
        assert "a" in table
    with table.held("b", None, lambda: "B", wait_s=0) as value:  # a is idle now: it goes
        assert value == "B" and "a" not in table


def test_a_waiting_session_gets_the_room_a_call_lets_go_of():
    table: SessionTable[str] = SessionTable(1, device="d")
    holding, release, got = threading.Event(), threading.Event(), []

    def hold() -> None:
        with table.held("a", None, lambda: "A"):
            holding.set()
            release.wait(10)

    def wait_for_room() -> None:
        with table.held("b", None, lambda: "B", wait_s=10) as value:
            got.append(value)

    holder, waiter = threading.Thread(target=hold), threading.Thread(target=wait_for_room)
    holder.start()
    assert holding.wait(10)
    waiter.start()
    release.set()
    holder.join(10)
    waiter.join(10)
    assert got == ["B"] and "a" not in table and table.alive == 1


def test_a_session_answers_only_its_owner():
    table: SessionTable[int] = SessionTable(4, device="d")
    mine, theirs = owner_digest("mine"), owner_digest("theirs")
    assert table.get_or_open("s", mine, lambda: 1) == 1
    assert table.get_or_open("s", mine, lambda: 2) == 1  # the same session, not a new one
    for owner in (theirs, None):
        with pytest.raises(SessionOwnerError, match="belongs to another client"):
            table.get_or_open("s", owner, lambda: 3)
        with pytest.raises(SessionOwnerError):
            table.end("s", owner)
    assert table.end("s", mine) and "s" not in table
    assert table.get_or_open("open", None, lambda: 4) == 4  # no secret: callers without one
    with pytest.raises(SessionOwnerError):
        table.get_or_open("open", mine, lambda: 5)


def test_a_table_that_evicts_nothing_keeps_its_session_until_ended():
    """The training server's table: one session, never evicted to make room (the server ends
    it and says why); ``use`` finds a session and records its use, opening nothing."""
    table: SessionTable[str] = SessionTable(1, device="d", evictable=lambda entry: False)
    table.get_or_open("a", None, lambda: "A")
    with pytest.raises(SessionsBusyError):
        table.get_or_open("b", None, lambda: "B")
    assert table.use("unknown") is None and len(table) == 1  # nothing opened, nothing evicted
    idle = table.idle_s("a")
    assert table.use("a") == "A" and table.idle_s("a") <= idle
    assert table.end("a") and table.get_or_open("b", None, lambda: "B") == "B"
    assert table.evicted == 0


# ---- the partition server's sessions ------------------------------------------------------------
def test_a_partition_session_refuses_another_secret(program):  # noqa: F811
    """A session's backend state answers the secret it was opened with (call metadata
    OWNER_KEY): the same id with another secret is refused PERMISSION_DENIED, and a client
    that sends none (ChainClient) keeps its own session ids as before."""
    backend = CountingBackend()
    program.use_backend(backend)
    server = server_for(program, "cloud")
    hop = Hop(server.loopback_channel(), server.limit, None)
    try:
        first = program.steps[0]
        sent = program.encode(first, first.compute(program.input_values(None)), first.sends)
        message = Message(program.plan_id, PLAN_VERSION, 1, [Part(n, d) for n, d in sent.items()])
        for _ in range(2):
            hop.run(message, 10.0, [(SESSION_KEY, "s"), (OWNER_KEY, "mine")])
        with pytest.raises(grpc.RpcError) as info:
            hop.run(message, 10.0, [(SESSION_KEY, "s"), (OWNER_KEY, "theirs")])
        assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "belongs to another client" in info.value.details()
        with ChainClient(program, server.loopback_channel(), session="other") as client:
            client.request()
        assert backend.seen == [1, 2, 1]
    finally:
        hop.close()
        program.use_backend(TorchBackend())


# ---- the shell and its handler ------------------------------------------------------------------
def test_the_partition_server_is_a_shell_around_a_composed_handler(program):  # noqa: F811
    with server_for(program, "cloud", max_workers=3, token="t") as server:
        assert isinstance(server.handler, PartitionHandler)
        assert server.slots.workers == 3 and server.token == "t"
        assert server.handler.fast is not None and server.handler.join is None
        described = server.describe()
        assert (described.device, list(described.outputs)) == ("cloud", server.handler.outputs)
        x = torch.randn(*program.graph.example_inputs[0].shape)
        with ChainClient(program, server.loopback_channel(), token="t") as client:
            got, = client.request([x]).outputs
        assert torch.allclose(got, program.unsplit([x])[0], atol=1e-5)


# ---- the shared serve flags ---------------------------------------------------------------------
@pytest.mark.parametrize("path", [("serve",), ("llm", "serve")])
def test_both_serve_commands_take_every_shared_flag(path):
    command = typer.main.get_command(app)
    for name in path:
        command = command.commands[name]  # type: ignore[attr-defined]
    declared = {d for p in command.params for d in (*p.opts, *p.secondary_opts)}
    for _, flags, _ in SERVE_FLAGS:
        for flag in flags:
            assert set(flag.decl.split("/")) <= declared, (path, flag.decl)
    workers = next(p for p in command.params if "--workers" in p.opts)
    assert workers.default == (8 if path == ("llm", "serve") else 32)


def test_serve_training_takes_the_shared_flags_that_mean_the_same_for_it(tmp_path, monkeypatch):
    """`serve-training` takes the token and TLS certificate flags from the same table (it calls
    no next device and has no data plane: none of those flags), read into its ServeOptions."""
    from typer.testing import CliRunner

    import edgesplit.train.remote

    command = typer.main.get_command(app).commands["serve-training"]  # type: ignore[attr-defined]
    declared = {d for p in command.params for d in (*p.opts, *p.secondary_opts)}
    assert {"--token", "--token-file", "--tls-cert", "--tls-key"} <= declared
    assert not {"--tls-ca", "--tls-server-name", "--workers", "--data-port", "--data-plane",
                "--shape", "--idle-timeout-s"} & declared
    seen = {}
    monkeypatch.setattr(edgesplit.train.remote, "serve_training",
                        lambda model, **kwargs: seen.update(kwargs))
    monkeypatch.delenv("EDGESPLIT_TOKEN", raising=False)
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    result = CliRunner().invoke(app, ["serve-training", "--token-file", str(token),
                                      "--port", "0"])
    assert result.exit_code == 0, result.output
    options = seen["options"]
    assert (options.token, options.tls, options.max_workers) == ("s3cret", None, None)

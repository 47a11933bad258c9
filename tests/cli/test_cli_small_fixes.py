"""Issue 37's small command-line fixes: help texts that survive rich markup and name every NAS
system, a busy port reported in our one line only, `run -n` as the total number of requests,
and AdaptiveNet saying why a budget changed and when a latency table is far off its roofline."""

from __future__ import annotations

import collections
import json
import os
import socket
import subprocess
import sys

import pytest
import typer.main
from rich.text import Text
from typer.testing import CliRunner

from edgesplit.cli import app
from edgesplit.errors import ConfigError
from edgesplit.nas.adaptivenet.latency import BlockLatencyTable, far_from_estimate
from edgesplit.nas.adaptivenet.run import budget_note
from edgesplit.nas.adaptivenet.space import Branch, ElasticSpace
from edgesplit.runtime.session import client_shares, run_requests
from edgesplit.transport.server import GrpcServer
from helpers import server_for

runner = CliRunner()
WIDE = {"COLUMNS": "250"}  # rich wraps help at the terminal's width: one line per option here


def _commands(command=None, path=()):
    """Every command and group of the CLI with its path (`nas adaptivenet serve`)."""
    command = command or typer.main.get_command(app)
    yield path, command
    for name, sub in getattr(command, "commands", {}).items():
        yield from _commands(sub, (*path, name))


# ---- a. help text through rich markup ------------------------------------------------------------
def test_no_help_text_loses_brackets_to_rich_markup():
    """typer renders help as rich markup, where `[ray]` is a style tag and vanishes: every
    command's, argument's and option's help must render to its own text (`\\[` is the escape)."""
    lost = []
    for path, command in _commands():
        texts = [command.help or "", *(getattr(p, "help", None) or "" for p in command.params)]
        for text in texts:
            if Text.from_markup(text).plain != text.replace("\\[", "["):
                lost.append(f"{' '.join(path) or 'edgesplit'}: {text!r}")
    assert not lost, "\n".join(lost)


def test_serve_help_prints_the_ray_extra():
    result = runner.invoke(app, ["serve", "--help"], env=WIDE)
    assert result.exit_code == 0, result.output
    assert "pip install 'edgesplit[ray]'" in result.output


# ---- b. nas --help names every system ------------------------------------------------------------
def test_nas_help_names_every_nas_system():
    nas = typer.main.get_command(app).commands["nas"]
    for system in ("JMSNAS", "SplitNets", "AdaptiveNet"):
        assert system in (nas.help or ""), nas.help
    groups = [name for name, sub in nas.commands.items() if hasattr(sub, "commands")]
    assert groups and all(name.lower() in (nas.help or "").lower() for name in groups)
    result = runner.invoke(app, ["nas", "--help"], env=WIDE)
    assert "JMSNAS, SplitNets and AdaptiveNet" in result.output


# ---- c. a busy port: our one line, not gRPC's log ------------------------------------------------
def test_busy_port_prints_only_our_one_line():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        env = {k: v for k, v in os.environ.items() if not k.startswith("GRPC_")}
        done = subprocess.run([sys.executable, "-m", "edgesplit.cli", "serve-training",
                               "--port", str(port)], capture_output=True, text=True, env=env,
                              timeout=120, check=False)
    assert done.returncode == 2, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert lines == [f"error: cannot listen on 127.0.0.1:{port}: the port is in use (another "
                     "server?); pick another --port"], done.stderr
    assert "add_port" not in done.stderr


class _Bare(GrpcServer):
    """A server with only the health service: what every edgesplit server binds through."""

    def __init__(self) -> None:
        self._init_grpc(lambda grpc_server: None, 1 << 20, 2)


def test_a_non_local_host_names_the_host_setting(capfd):
    server = _Bare()
    with pytest.raises(ConfigError, match="not a local address; pick another host"):
        server.start("192.0.2.1", 0)  # TEST-NET-1: documentation only, never this machine's
    assert "add_port" not in capfd.readouterr().err
    assert server.start("127.0.0.1", 0) > 0  # the same server still binds where it can
    server.stop(grace_s=0)


# ---- d. run -n is the total ----------------------------------------------------------------------
@pytest.mark.parametrize(("requests", "concurrency", "shares"), [
    (20, 4, [5, 5, 5, 5]), (7, 3, [3, 2, 2]), (3, 8, [1, 1, 1]), (1, 1, [1])])
def test_client_shares_add_up_to_the_requests(requests, concurrency, shares):
    assert client_shares(requests, concurrency) == shares


def test_run_requests_sends_the_total_across_clients(digits_chain):
    server = server_for(digits_chain, "cloud", shape=False)
    try:
        report = run_requests(digits_chain, server.loopback_channel(), requests=10,
                              concurrency=4, client_options={"shape": False})
    finally:
        server.stop(grace_s=1.0)
    assert (report["requests"], report["ok"], report["errors"]) == (10, 10, 0)
    assert report["concurrency"] == 4
    assert collections.Counter(r["client"] for r in report["per_request"]) == {
        0: 3, 1: 3, 2: 2, 3: 2}


def test_cli_run_n_20_c_4_sends_20_requests(digits_chain, tmp_path):
    plan = tmp_path / "plan.json"
    digits_chain.plan.save(plan)
    server = server_for(digits_chain, "cloud", shape=False)
    port = server.start("127.0.0.1", 0)
    try:
        result = runner.invoke(app, ["run", str(plan), "--server", f"127.0.0.1:{port}",
                                     "-n", "20", "-c", "4", "--timeout-s", "30", "--json"])
    finally:
        server.stop(grace_s=1.0)
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert (doc["requests"], doc["ok"], len(doc["per_request"])) == (20, 20, 20)
    assert doc["concurrency"] == 4
    help_text = runner.invoke(app, ["run", "--help"], env=WIDE).output
    assert "Requests in all" in help_text


# ---- e. serving says why its budget is not the search's ------------------------------------------
def test_serve_budget_note_names_both_budgets_and_the_scale():
    doc = {"budget_ms": 1.1, "searched_budget_ms": 1.513,
           "calibration": {"scale": 1.1 / 1.513, "optimal": ["b0", "b1"],
                           "optimal_predicted_ms": 1.4, "optimal_measured_ms": 1.4 * 1.1 / 1.513,
                           "requests": 20}}
    note = budget_note(doc)
    assert note is not None and "\n" not in note
    assert note.startswith("budget 1.1 ms, not the search's 1.513 ms: scaled x0.727")
    assert "1.018 ms, median of 20 requests" in note and "search's 1.4 ms" in note
    assert budget_note({**doc, "calibration": None}) is None  # not calibrated: nothing to say
    assert budget_note({**doc, "budget_ms": 1.513}) is None  # the same budget


# ---- f. a latency table far off its estimate -----------------------------------------------------
def _space() -> ElasticSpace:
    """Three blocks and one merged branch over the first two."""
    return ElasticSpace(3, (Branch("b0", 0, 1, 0, 0), Branch("b0+1", 0, 2, 1, 0),
                            Branch("b1", 1, 2, 0, 1), Branch("b2", 2, 3, 0, 2)))


def _table(**seconds: float) -> BlockLatencyTable:
    times = {"b0": 1e-3, "b0+1": 1.5e-3, "b1": 2e-3, "b2": 1e-3, **seconds}
    return BlockLatencyTable(_space(), {k.replace("_", "+"): v for k, v in times.items()},
                             1e-5, 1)


ESTIMATE = {"b0": 0.8e-3, "b1": 1.0e-3, "b2": 0.5e-3}


def test_a_slow_measured_block_is_named_with_both_numbers():
    warning = far_from_estimate(_table(b1=120e-3), ESTIMATE, estimate="this-machine roofline "
                                                                        "estimate")
    assert warning is not None and "\n" not in warning
    assert "pretrained path (b0-b1-b2) at 122 ms" in warning
    assert "53x its this-machine roofline estimate of 2.3 ms" in warning
    assert "block b1: 120 ms measured, 1 ms estimated" in warning


def test_a_table_near_its_estimate_or_tiny_gives_no_warning():
    assert far_from_estimate(_table(), ESTIMATE) is None  # 1.7x
    # 18x a tiny estimate, but within the slack eager PyTorch's per-op overhead needs
    tiny = {k: v / 100 for k, v in ESTIMATE.items()}
    assert far_from_estimate(_table(b0=0.1e-3, b1=0.2e-3, b2=0.1e-3), tiny) is None
    assert far_from_estimate(_table(b1=120e-3), {"b0": 1e-3}) is None  # no estimate for b1


@pytest.mark.usefixtures("one_torch_thread")
def test_search_checks_a_measured_table_against_this_machines_roofline():
    """The search's check on digits_cnn's supernet, with one block's measurement made slow."""
    from edgesplit.graph import capture
    from edgesplit.nas.adaptivenet.elastify import elastify
    from edgesplit.nas.adaptivenet.run import _table_check

    graph = capture("digits_cnn")
    supernet = elastify(graph)
    example = tuple(graph.example_inputs)
    space = supernet.space
    quick = BlockLatencyTable(space, dict.fromkeys(space.by_name, 20e-6), 1e-6, 1)
    assert _table_check(supernet, quick, example) is None
    slow_block = space.original[1]
    slow = BlockLatencyTable(space, {**quick.branch_seconds, slow_block: 0.1236}, 1e-6, 1)
    warning = _table_check(supernet, slow, example)
    assert warning is not None
    assert f"block {slow_block}: 123.6 ms measured" in warning
    assert "this-machine roofline estimate" in warning

"""`serve` and `llm serve` take the connection limits as flags (--idle-timeout-s,
--frame-timeout-s, --hello-timeout-s, --pending-bytes): a server started from the command line
applies them (a silent caller is cut off at the flag's deadline, not the default's), and a bad
value is one line naming its flag, before the plan is read."""

from __future__ import annotations

import socket

import pytest
from typer.testing import CliRunner

from edgesplit.cli import app
from edgesplit.cli._app import connection_limits
from edgesplit.errors import ConfigError
from edgesplit.hardware import chain, get_topology
from edgesplit.llm import LLMWorkload, plan_llm_at
from edgesplit.transport.limits import ConnectionLimits

runner = CliRunner()
FLAGS = ["--hello-timeout-s", "0.3", "--idle-timeout-s", "40", "--frame-timeout-s", "7",
         "--pending-bytes", "64MiB"]


@pytest.fixture(scope="module")
def plan_file(tmp_path_factory):
    """llama_tiny split after block.1 over home-wifi's phone and laptop, saved (the plan
    tests/llm/test_llm_runtime_cli.py serves)."""
    full = get_topology("home-wifi")
    topology = chain("two", full.devices[:2], [full.links[0].link])
    path = tmp_path_factory.mktemp("llm") / "plan.json"
    plan_llm_at("llama_tiny", topology, (0, 3, 6),
                LLMWorkload(prompt_tokens=6, new_tokens=8, max_context=24)).save(path)
    return path


def test_no_flag_keeps_the_servers_defaults_and_given_ones_override_only_themselves():
    assert connection_limits(None, None, None, None) is None
    limits = connection_limits(None, 7.0, None, "64MiB")
    assert limits == ConnectionLimits(frame_s=7.0, pending_bytes=64 << 20)


def _silent_caller_is_cut_off(seen: dict):
    """A stand-in for serve_forever: records the server's limits, then connects to its data
    plane without a word. The flag's 0.3 s hello deadline hangs up within the 5 s wait; the
    default (10 s) would not, so the recv times out and the test fails."""
    def serve(server) -> None:
        try:
            seen["limits"] = server.limits
            with socket.create_connection(("127.0.0.1", server.data_port), timeout=5) as sock:
                seen["hung_up"] = sock.recv(1) == b""
        finally:
            server.stop(0)
    return serve


@pytest.mark.parametrize("command", ["serve", "llm serve"])
def test_a_server_started_from_the_cli_applies_the_flags(command, digits_chain, plan_file,
                                                         tmp_path, monkeypatch):
    import edgesplit.transport

    seen: dict = {}
    monkeypatch.setattr(edgesplit.transport, "serve_forever", _silent_caller_is_cut_off(seen))
    if command == "serve":
        plan = tmp_path / "plan.json"
        digits_chain.plan.save(plan)
        argv = ["serve", str(plan), "--device", "cloud"]
    else:
        argv = ["llm", "serve", str(plan_file), "--device", "laptop"]
    result = runner.invoke(app, [*argv, "--port", "0", "--threads", "1", *FLAGS])
    assert result.exit_code == 0, result.output
    assert seen["limits"] == ConnectionLimits(idle_s=40, frame_s=7, hello_s=0.3,
                                              pending_bytes=64 << 20)
    assert seen["hung_up"]


@pytest.mark.parametrize("command", [["serve"], ["llm", "serve"]])
@pytest.mark.parametrize("flags, message", [
    (["--hello-timeout-s", "0"], "--hello-timeout-s must be positive"),
    (["--idle-timeout-s", "-1"], "--idle-timeout-s must be positive"),
    (["--pending-bytes", "lots"], "--pending-bytes 'lots' is not a size"),
    (["--pending-bytes", "0MiB"], "--pending-bytes must be positive"),
])
def test_a_bad_limit_is_one_line_before_the_plan_is_read(command, flags, message, tmp_path):
    # the plan does not exist: the flags are checked before it is read
    result = runner.invoke(app, [*command, str(tmp_path / "none.json"), "--device", "x",
                                 *flags])
    assert result.exit_code != 0
    assert message in result.output and "Traceback" not in result.output
    assert len([line for line in result.output.splitlines() if line.strip()]) == 1


def test_the_helper_refuses_like_the_flags():
    with pytest.raises(ConfigError, match="--frame-timeout-s must be positive"):
        connection_limits(None, 0.0, None, None)

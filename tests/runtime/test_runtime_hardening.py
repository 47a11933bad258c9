"""Serving under hostile or careless use, in process: one server per port, a TLS key pair that
does not match, tokens kept off the command line, and deadlines that travel down a chain so that
abandoned requests free every hop."""

from __future__ import annotations

import socket
import subprocess
import threading

import grpc
import pytest
import torch

from edgesplit.errors import ConfigError, RemoteError
from edgesplit.graph import capture
from edgesplit.hardware import chain, get_device, get_link
from edgesplit.plan import PLAN_VERSION, EdgeCloudSetting, PlanningProblem
from edgesplit.plan.multisplit import ChainCosts, chain_plan, evaluate_boundaries
from edgesplit.plan.planners import Manual
from edgesplit.runtime import PlanProgram
from edgesplit.runtime.client import ChainClient
from edgesplit.transport import TlsFiles, check_tls_pair, read_token
from helpers import listening, server_for, wait_until


@pytest.fixture(scope="module")
def three_hops():
    """a -> b -> c, a few layers on each device."""
    graph = capture("digits_cnn")
    base = get_device("raspberry-pi-4")
    devices = [base.model_copy(update={"name": n}) for n in ("a", "b", "c")]
    link = get_link("4g")
    topology = chain("abc", devices, [link, link])
    costs = ChainCosts.build(graph, topology)
    n = len(graph.layers)
    assignment = evaluate_boundaries(costs, [0, 2, 5, n])
    plan = chain_plan(costs, assignment, topology, method="manual", source="a")
    return PlanProgram.load(plan, graph)


def _key_pair(tmp_path, name: str) -> tuple[bytes, bytes]:
    key, cert = tmp_path / f"{name}-key.pem", tmp_path / f"{name}-cert.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout",
                    str(key), "-out", str(cert), "-days", "1", "-subj", "/CN=localhost"],
                   check=True, capture_output=True)
    return cert.read_bytes(), key.read_bytes()


def test_a_second_server_on_the_same_port_is_refused(program):
    """gRPC sets SO_REUSEPORT by default: a second server would silently share the port."""
    first = server_for(program, "cloud", shape=False)
    port = first.start()
    second = server_for(program, "cloud", shape=False)
    try:
        with pytest.raises(ConfigError, match="in use"):
            second.start(port=port)
    finally:
        first.stop(0)
        second.stop(0)


def test_a_certificate_and_key_that_do_not_match_are_named(program, tmp_path):
    cert_a, key_a = _key_pair(tmp_path, "a")
    _, key_b = _key_pair(tmp_path, "b")
    check_tls_pair(TlsFiles(cert=cert_a, key=key_a))  # a real pair passes
    with pytest.raises(ConfigError, match="do not belong together"):
        check_tls_pair(TlsFiles(cert=cert_a, key=key_b))
    with pytest.raises(ConfigError, match="not a PEM"):
        check_tls_pair(TlsFiles(cert=b"junk", key=key_a))
    with pytest.raises(ConfigError, match="both a certificate and its private key"):
        check_tls_pair(TlsFiles(cert=cert_a))
    with (server_for(program, "cloud", shape=False, tls=TlsFiles(cert=cert_a, key=key_b)) as server,
          pytest.raises(ConfigError, match="do not belong together")):
        server.start()


def test_token_from_a_file_or_the_environment(tmp_path, monkeypatch):
    monkeypatch.delenv("EDGESPLIT_TOKEN", raising=False)
    assert read_token() is None
    assert read_token("abc") == "abc"
    path = tmp_path / "token"
    path.write_text("from-file\n")
    assert read_token(token_file=path) == "from-file"
    monkeypatch.setenv("EDGESPLIT_TOKEN", "from-env")
    assert read_token() == "from-env"
    assert read_token("given") == "given"  # an explicit token wins over the environment
    with pytest.raises(ConfigError, match="not both"):
        read_token("abc", path)
    with pytest.raises(ConfigError, match="does not exist"):
        read_token(token_file=tmp_path / "missing")
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(ConfigError, match="empty"):
        read_token(token_file=tmp_path / "empty")
    with pytest.raises(ConfigError, match="printable ASCII"):
        read_token("line\nbreak")


def test_cli_serve_reads_the_token_from_a_file(program, tmp_path):
    """The token never has to appear on a command line (visible to every user in ps)."""
    from typer.testing import CliRunner

    from edgesplit.cli import app

    (tmp_path / "token").write_text("s3cret\n")
    result = CliRunner().invoke(app, ["serve", str(tmp_path / "missing-plan.json"), "--device",
                                      "cloud", "--token", "x", "--token-file",
                                      str(tmp_path / "token")])
    assert result.exit_code == 2 and "not both" in result.output


class _Held:
    """Holds device ``c``'s compute until released: the chain's slow last hop."""

    def __init__(self, program: PlanProgram, device: str) -> None:
        self.step, self.release = program.step(device), threading.Event()
        compute = self.step.compute

        def held(values):
            self.release.wait(30)
            return compute(values)

        self.step.compute = held

    def __enter__(self) -> _Held:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release.set()
        del self.step.compute  # back to the class's method


def test_deadlines_travel_down_the_chain_and_abandoned_requests_free_the_hops(three_hops):
    """Clients that give up after 0.3 s must not leave the middle hop waiting on the last one
    (it used to wait a fixed 60 s): the hop forwards with the caller's remaining deadline and
    cancels its own call when the caller goes away, so its two workers are free again while
    the last hop is still stuck. Broken, the health check below waits for a free worker and
    times out."""
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with (listening(three_hops, "c", shape=False, max_workers=8) as (_, last),
          listening(three_hops, "b", shape=False, max_workers=2,
                    next_address=last) as (_, address),
          _Held(three_hops, "c"),
          ChainClient(three_hops, address, shape=False, timeout_s=0.3) as client):
        client.check_plan()
        errors: list[str] = []

        def one() -> None:
            try:
                client.request()
            except RemoteError as exc:
                errors.append(str(exc))

        threads = [threading.Thread(target=one) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(errors) == 4 and all("in time" in e for e in errors), errors
        with grpc.insecure_channel(address) as channel:  # the last hop is still held
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(), timeout=10)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING


def test_a_middle_hop_on_the_data_plane_stops_waiting_when_its_caller_hangs_up(three_hops):
    """Over frames there is no gRPC callback to cancel the next hop's call: the middle hop
    watches its caller's connection while it waits, so a caller that hangs up with a long
    deadline left frees the hop's worker at once instead of after that deadline."""

    from edgesplit.runtime.dataplane import Message, Part
    from edgesplit.transport.frames import write_frame

    with (listening(three_hops, "c", shape=False) as (_, last),
          listening(three_hops, "b", shape=False, max_workers=1, next_address=last) as (hop, _)):
        a = three_hops.steps[0]
        values = a.compute(three_hops.input_values())
        message = Message(three_hops.plan_id, PLAN_VERSION, 1, [
            Part(n, d) for n, d in three_hops.encode(a, values, a.sends).items()])
        assert hop.data_port is not None

        with _Held(three_hops, "c"):
            caller = socket.create_connection(("127.0.0.1", hop.data_port))
            write_frame(caller, message.to_frame(metadata=[], timeout_s=60.0))
            assert wait_until(lambda: hop.slots._slots._free == 0)  # forwarded, waiting on "c"
            caller.close()  # the caller hangs up with 60 s left
            assert wait_until(lambda: hop.slots._slots._free == 1), "the hop still waits on 'c'"


def test_a_chain_serves_again_after_abandoned_requests(three_hops):
    with (listening(three_hops, "c", shape=False) as (_, last),
          listening(three_hops, "b", shape=False, next_address=last) as (_, address)):
        with (_Held(three_hops, "c"),
              ChainClient(three_hops, address, shape=False, timeout_s=0.4) as client,
              pytest.raises(RemoteError, match="did not answer in time")):
            client.request()
        with ChainClient(three_hops, address, shape=False) as client:
            out = client.request().outputs[0]
        assert torch.allclose(out, three_hops.unsplit()[0], atol=1e-5)


def test_serve_accepts_the_preset_a_plan_device_was_planned_with(program):
    from edgesplit.runtime.planned import plan_device

    assert plan_device(program, "cloud") == "cloud"
    assert plan_device(program, "v100-server") == "cloud"  # one plan device uses that preset
    nano = get_device("jetson-nano")
    same = PlanProgram.load(Manual(["down1.0"]).plan(PlanningProblem("digits_cnn", EdgeCloudSetting(
        edge=nano, cloud=nano, link=get_link("4g")))), program.graph)
    with pytest.raises(ConfigError, match="2 plan devices use 'jetson-nano'"):
        plan_device(same, "jetson-nano")
    with pytest.raises(ConfigError, match=r"cloud \(v100-server\)"):
        plan_device(program, "tpu")
    with server_for(program, "v100-server", shape=False) as server:
        assert server.handler.step.name == "cloud"

"""The Ray Serve engine (issue 21): a plan's cloud partition as a deployment of replicas behind
edgesplit's own ingress, on one local Ray cluster started and stopped here (loopback only)."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest
import torch
from typer.testing import CliRunner

from edgesplit.cli import app
from edgesplit.errors import ConfigError
from edgesplit.plan.model import PLAN_VERSION
from edgesplit.runtime import PlanProgram
from edgesplit.runtime.client import ChainClient
from edgesplit.runtime.planned import max_message_bytes
from edgesplit.runtime.proto import edgesplit_runtime_pb2 as pb
from edgesplit.runtime.proto import edgesplit_runtime_pb2_grpc as pb_grpc
from edgesplit.runtime.ray_engine import RayEngine, RayOptions, import_ray
from helpers import listening, server_for, wait_until

ray = pytest.importorskip("ray", reason="the Ray engine needs edgesplit[ray]")
from ray import serve  # noqa: E402

# one Ray cluster per test session, on one xdist worker (`make test` runs --dist loadgroup)
pytestmark = pytest.mark.xdist_group("ray")
CPUS = 2
REPLICA_CPUS = 0.5  # two deployments of two replicas fit the cluster at once
TOL = 1e-4  # batched kernels may round differently from one sample alone


@pytest.fixture(scope="module")
def cluster():
    ray.init(num_cpus=CPUS, include_dashboard=False, log_to_driver=False)
    yield ray.get_runtime_context().gcs_address
    serve.shutdown()
    ray.shutdown()


@pytest.fixture(scope="module")
def served(cluster, program):
    """The cloud partition on 2 replicas (batching up to 8) behind an ingress on loopback."""
    engine = RayEngine(program, "cloud", RayOptions(replicas=2, replica_cpus=REPLICA_CPUS,
                                                    max_batch=8, app_name="test-two"))
    server = server_for(program, "cloud", shape=False, engine=engine)
    port = server.start()
    yield server, f"127.0.0.1:{port}"
    server.stop(0)


def _inputs(k: int) -> tuple[torch.Tensor, ...]:
    return (torch.randn(1, 1, 32, 32, generator=torch.Generator().manual_seed(k)),)


def _diff(program: PlanProgram, address: str, k: int) -> float:
    with ChainClient(program, address, shape=False) as client:
        result = client.request(_inputs(k))
    return float((result.outputs[0] - program.unsplit(_inputs(k))[0]).abs().max())


# ---- outputs, spread, batching --------------------------------------------------------------
def test_outputs_equal_the_unsplit_model_and_both_replicas_serve(served, program):
    server, address = served
    with ThreadPoolExecutor(8) as pool:
        diffs = list(pool.map(lambda k: _diff(program, address, k), range(48)))
    assert max(diffs) < TOL
    assert len(server.handler.compute.engine.served_by) == 2  # requests spread over both replicas
    assert sum(server.handler.compute.engine.served_by.values()) >= 48


def test_replies_report_the_replica_compute_and_the_hop_to_it(served, program):
    _, address = served
    with ChainClient(program, address, shape=False) as client:
        hops = client.request(_inputs(0)).hops_ms
    assert hops["cloud.compute_ms"] > 0 and hops["cloud.engine_ms"] >= 0


def test_the_data_plane_and_grpc_reach_the_same_deployment(served, program):
    _, address = served
    for mode in ("tcp", "grpc"):
        with ChainClient(program, address, shape=False, data_plane=mode) as client:
            out = client.request(_inputs(3)).outputs[0]
        assert torch.allclose(out, program.unsplit(_inputs(3))[0], atol=TOL, rtol=0)


def test_replica_batches_are_exact_and_a_bad_request_fails_alone(cluster, program):
    """@serve.batch on the freed-batch partition: concurrent requests compute as one batch,
    each answered as alone; a request the batch cannot take fails alone."""
    from edgesplit.runtime.ray_replica import from_arrays, to_arrays

    engine = RayEngine(program, "cloud", RayOptions(replica_cpus=REPLICA_CPUS, max_batch=7,
                                                    max_wait_ms=2000, app_name="test-batch"))
    try:
        edge = program.steps[0]
        requests = [to_arrays(edge.compute(program.input_values(_inputs(k))), ["relu_1"])
                    for k in range(6)]
        bad = {"relu_1": requests[0]["relu_1"][:, :8]}  # 8 of 32 channels

        def at_once(batch):  # sent together: the batch fills (7) or its wait ends (2 s)
            return [r.result(timeout_s=60) for r in [engine.handle.remote(a) for a in batch]]

        replies = at_once([*requests[:2], bad, *requests[2:]])
        assert replies[2].error is not None and replies[2].outputs is None
        good = replies[:2] + replies[3:]
        clean = at_once(requests)
        for k, (first, second) in enumerate(zip(good, clean, strict=True)):
            alone = program.unsplit(_inputs(k))[0]
            for reply in (first, second):
                assert reply.error is None
                got = from_arrays(reply.outputs)[program.outputs[0]]
                assert torch.allclose(got, alone, atol=TOL, rtol=0)
        # with the bad request the batch failed and each ran again alone; without, together
        assert {r.batch for r in good} == {1} and {r.batch for r in clean} == {6}
    finally:
        engine.close()


def test_a_middle_hop_can_be_a_deployment(cluster):
    """a -> b -> c with b on Ray: its ingress computes through the deployment and forwards to
    c; the token travels on."""
    program = _three_hops("digits_cnn")
    last = server_for(program, "c", shape=False, token="s3cret")
    c_address = f"127.0.0.1:{last.start()}"
    engine = RayEngine(program, "b", RayOptions(replica_cpus=REPLICA_CPUS, app_name="test-mid"))
    middle = server_for(program, "b", shape=False, token="s3cret", engine=engine,
                        next_address=c_address)
    try:
        address = f"127.0.0.1:{middle.start()}"
        for k in range(3):
            with ChainClient(program, address, shape=False, token="s3cret") as client:
                result = client.request(_inputs(k))
            assert torch.allclose(result.outputs[0], program.unsplit(_inputs(k))[0], atol=TOL,
                                  rtol=0)
            assert {"b.engine_ms", "c.compute_ms"} <= set(result.hops_ms)
    finally:
        middle.stop(0)
        last.stop(0)


def _three_hops(source: str, cuts: tuple[int, int] = (2, 5)) -> PlanProgram:
    """digits_cnn over a -> b -> c (``source``: the plan's model source; b holds the layers
    between the two ``cuts``)."""
    from edgesplit.graph import capture
    from edgesplit.hardware import chain, get_device, get_link
    from edgesplit.plan.multisplit import ChainCosts, chain_plan, evaluate_boundaries

    graph = capture("digits_cnn")
    base = get_device("raspberry-pi-4")
    devices = [base.model_copy(update={"name": n}) for n in ("a", "b", "c")]
    topology = chain("abc", devices, [get_link("4g")] * 2)
    costs = ChainCosts.build(graph, topology)
    assignment = evaluate_boundaries(costs, [0, *cuts, len(graph.layers)])
    plan = chain_plan(costs, assignment, topology, method="manual", source=source)
    return PlanProgram.load(plan, graph)


def test_a_replica_that_cannot_load_the_plan_is_named(cluster):
    program = _three_hops("no_such_model")  # loads here (its graph is given), not in Ray
    with pytest.raises(ConfigError, match="unknown model 'no_such_model'"):
        RayEngine(program, "b", RayOptions(replica_cpus=REPLICA_CPUS, app_name="test-bad",
                                           constructor_retries=1))
    assert "test-bad" not in serve.status().applications


# ---- failures -------------------------------------------------------------------------------
def test_a_killed_replica_is_replaced_and_no_request_is_lost(cluster, program):
    engine = RayEngine(program, "cloud", RayOptions(replicas=2, replica_cpus=REPLICA_CPUS,
                                                    max_batch=1, app_name="test-kill"))
    with listening(program, "cloud", shape=False, engine=engine) as (_, address):
        before = _replica_ids("test-kill")
        assert len(before) == 2
        seen: list[tuple[int, int]] = []  # (client, request id) of every reply
        lock, stop = threading.Lock(), threading.Event()

        def client(c: int) -> float:
            worst, i = 0.0, 0
            with ChainClient(program, address, shape=False, retries=3) as chain:
                while not stop.is_set():
                    k, i = 1000 * c + i, i + 1
                    result = chain.request(_inputs(k))
                    with lock:
                        seen.append((c, result.request_id))
                    worst = max(worst, float(
                        (result.outputs[0] - program.unsplit(_inputs(k))[0]).abs().max()))
            return worst

        def wait_for(n: int) -> None:
            assert wait_until(lambda: len(seen) >= n, 60), f"{len(seen)} replies, waiting for {n}"

        with ThreadPoolExecutor(4) as pool:
            futures = [pool.submit(client, c) for c in range(4)]
            wait_for(20)  # mid-load: requests in flight on both replicas
            ray.kill(ray.get_actor(f"SERVE_REPLICA::test-kill#edgesplit-cloud#{before[0]}",
                                   namespace="serve"), no_restart=True)
            at_kill = len(seen)
            wait_for(at_kill + 40)  # and the load goes on without it
            stop.set()
            worst = max(f.result(timeout=120) for f in futures)
        assert worst < TOL  # every reply is its own request's answer
        for c in range(4):  # each request answered once, in order: none lost or repeated
            ids = [r for client, r in seen if client == c]
            assert ids == list(range(1, len(ids) + 1))
        deadline = time.monotonic() + 120
        while True:  # Serve starts a replacement
            now = _replica_ids("test-kill")
            if len(now) == 2 and before[0] not in now:
                break
            assert time.monotonic() < deadline, f"no replacement replica: {now}"
            time.sleep(1)
        assert _diff(program, address, 7) < TOL
    assert "test-kill" not in serve.status().applications  # stop deleted the application


def _replica_ids(app_name: str) -> list[str]:
    prefix = f"SERVE_REPLICA::{app_name}#edgesplit-cloud#"
    return sorted(a["name"][len(prefix):] for a in ray.util.list_named_actors(all_namespaces=True)
                  if a["name"].startswith(prefix))


def _bad_requests(program: PlanProgram) -> dict[str, pb.Bundle]:
    from test_runtime import _bad_cases

    cases = {}
    for name, (tensors, fields, _code, _text) in _bad_cases(max_message_bytes(program)).items():
        bundle = pb.Bundle(plan_id=program.plan_id, plan_version=PLAN_VERSION, request_id=7,
                           tensors=tensors)
        for key, value in fields.items():
            setattr(bundle, key, value)
        cases[name] = bundle
    return cases


def test_bad_requests_get_the_same_errors_as_the_local_server(served, program):
    with listening(program, "cloud", shape=False) as (_, local_address):
        answers = {}
        for address in (local_address, served[1]):
            with grpc.insecure_channel(address, options=[
                    ("grpc.max_send_message_length", 64 << 20)]) as channel:
                stub = pb_grpc.PartitionServiceStub(channel)
                for name, bundle in _bad_requests(program).items():
                    with pytest.raises(grpc.RpcError) as info:
                        stub.Run(bundle, timeout=30)
                    answers.setdefault(name, []).append((info.value.code(),
                                                         info.value.details()))
        for name, (here, there) in answers.items():
            assert here == there, name
    assert _diff(program, served[1], 1) < TOL  # and it serves the next request


def test_autoscaling_emulation_and_health(cluster, program):
    """An autoscaled deployment serves; --emulate-device paces the replica's compute to the
    plan (and turns batching off there), and the reply says how long it slept. The ingress's
    health says SERVING while the application runs, NOT_SERVING once it is gone and after
    stop."""
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    engine = RayEngine(program, "cloud", RayOptions(
        min_replicas=1, max_replicas=2, replica_cpus=REPLICA_CPUS, app_name="test-auto"),
        emulate=True)
    with server_for(program, "cloud", shape=False, engine=engine) as server:
        address = f"127.0.0.1:{server.start()}"
        assert engine.replica_info["batching"] == "off"
        app = serve.status().applications["test-auto"]
        assert str(app.status).endswith("RUNNING")
        with ChainClient(program, address, shape=False) as client:
            result = client.request(_inputs(4))
        target = program.plan.predicted.compute_ms["cloud"]
        hops = result.hops_ms
        assert hops["cloud.compute_ms"] >= target * 0.99  # slept up to the plan's time
        assert "cloud.emulated_ms" in hops
        assert torch.allclose(result.outputs[0], program.unsplit(_inputs(4))[0], atol=TOL,
                              rtol=0)
        serving = health_pb2.HealthCheckResponse.SERVING
        with grpc.insecure_channel(address) as channel:
            check = health_pb2_grpc.HealthStub(channel).Check
            assert check(health_pb2.HealthCheckRequest(), timeout=10).status == serving
            serve.delete("test-auto")  # the deployment goes away under the ingress
            assert wait_until(
                lambda: check(health_pb2.HealthCheckRequest(), timeout=10).status != serving,
                30, 0.2), "health still says SERVING"
    assert server.health.Check(health_pb2.HealthCheckRequest(), None).status == \
        health_pb2.HealthCheckResponse.NOT_SERVING


def test_an_application_of_the_same_name_is_not_taken_over(served, program):
    with pytest.raises(ConfigError, match="already runs an application 'test-two'"):
        RayEngine(program, "cloud", RayOptions(replica_cpus=REPLICA_CPUS, app_name="test-two"))
    assert _diff(program, served[1], 2) < TOL  # the running one is untouched


def test_replicas_the_cluster_cannot_place_are_refused_or_warned(cluster, program, caplog):
    # the tests' cluster was joined, not started by the engine (it may grow): a warning; a
    # cluster the engine started itself cannot: an error (checked without starting one)
    engine = RayEngine.__new__(RayEngine)
    engine.ray, engine.serve = import_ray()
    engine.options = RayOptions(replicas=5, replica_cpus=1)
    engine._own_cluster, engine._watcher = False, None
    engine._watch_stop = threading.Event()
    with caplog.at_level("WARNING"):
        engine._check_room()
    assert "need 5 CPUs; the Ray cluster has 2" in caplog.text
    engine._own_cluster = True
    engine.close = lambda **_: None  # (it would stop the tests' cluster)
    with pytest.raises(ConfigError, match="lower replicas or replica_cpus"):
        engine._check_room()


def test_the_engine_refuses_a_relay_and_the_wrong_device(cluster, program):
    relay = _three_hops("digits_cnn", cuts=(2, 2))  # b holds no layers: it only relays
    assert relay.step("b").partition is None
    with pytest.raises(ConfigError, match="computes nothing in this plan"):
        RayEngine(relay, "b", RayOptions(replica_cpus=REPLICA_CPUS, app_name="test-relay"))
    assert "test-relay" not in serve.status().applications
    engine = RayEngine.__new__(RayEngine)
    engine.device = "edge"
    with pytest.raises(ConfigError, match="engine runs device"):
        server_for(program, "cloud", shape=False, engine=engine)


@pytest.mark.parametrize("kwargs, text", [
    ({"replicas": 0}, "replicas"),
    ({"min_replicas": 1}, "max_replicas"),
    ({"min_replicas": 3, "max_replicas": 2}, "autoscaling"),
    ({"replica_cpus": 0}, "replica_cpus"),
    ({"target_ongoing": 0}, "target_ongoing"),
    ({"max_batch": 0}, "max_batch"),
])
def test_options_are_checked(kwargs, text):
    with pytest.raises(ConfigError, match=text):
        RayOptions(**kwargs)


def test_autoscaling_bounds_become_rays():
    opts = RayOptions(replicas=5, min_replicas=1, max_replicas=3, target_ongoing=4).deployment()
    assert opts["autoscaling_config"] == {"min_replicas": 1, "max_replicas": 3,
                                          "initial_replicas": 3, "target_ongoing_requests": 4}
    assert RayOptions(replicas=2).deployment()["num_replicas"] == 2


# ---- without the extra ----------------------------------------------------------------------
def test_without_ray_the_engine_names_the_install_command(monkeypatch, tmp_path, program):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray fails as if not installed
    with pytest.raises(ConfigError, match=r"pip install 'edgesplit\[ray\]'"):
        import_ray()
    plan = tmp_path / "plan.json"
    program.plan.save(plan)
    result = CliRunner().invoke(app, ["serve", str(plan), "--device", "cloud", "--engine",
                                      "ray"])
    assert result.exit_code == 2
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and "pip install 'edgesplit[ray]'" in lines[0], result.output


# ---- the command line -----------------------------------------------------------------------
def test_cli_serve_engine_ray_joins_a_cluster_and_stops_gracefully(cluster, program, tmp_path):
    plan = tmp_path / "plan.json"
    program.plan.save(plan)
    cmd = [sys.executable, "-m", "edgesplit.cli", "serve", str(plan), "--device", "cloud",
           "--port", "0", "--no-shape", "--engine", "ray", "--ray-address", cluster,
           "--replicas", "1", "--replica-cpus", str(REPLICA_CPUS), "--threads", "1"]
    log = tmp_path / "serve.err"
    with open(log, "w") as stderr:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=stderr, text=True)
        try:
            line = proc.stdout.readline()
            assert line.startswith("listening on "), log.read_text()[-2000:]
            assert "engine=ray" in line and "replicas=1" in line, line
            address = line.split()[2]
            assert _diff(program, address, 5) < TOL
            apps = serve.status().applications
            assert any(name.endswith("-cloud") for name in apps)
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=60) == 0, log.read_text()[-2000:]
        finally:
            if proc.poll() is None:
                proc.kill()
    # its application is gone; the cluster it joined is still up
    assert not any(name.startswith(f"edgesplit-{program.plan_id}")
                   for name in serve.status().applications)
    assert ray.is_initialized() and ray.cluster_resources().get("CPU") == CPUS


@pytest.mark.parametrize("flags, text", [
    (["--replicas", "2"], "--replicas configure the Ray engine: add --engine ray"),
    (["--engine", "spark"], "--engine takes local, ray, not 'spark'"),
])
def test_cli_refuses_ray_options_without_the_engine_and_unknown_engines(program, tmp_path,
                                                                         flags, text):
    plan = tmp_path / "plan.json"
    program.plan.save(plan)
    result = CliRunner().invoke(app, ["serve", str(plan), "--device", "cloud", *flags])
    assert result.exit_code == 2 and text in result.output, result.output

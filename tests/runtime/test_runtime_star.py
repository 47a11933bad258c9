"""Star plans (SplitNets' multi-view fusion) planned, run in process, served and driven.

The model: three 1x16x16 camera views, the same small conv branch on each, a 1x1 Conv-Reduce
per view to D channels, the views fused *interlaced* (`stack(dim=2).flatten(1, 2)`) and a
conv + pool + linear head. Branch v and its reduce conv run on ``sensor{v}``, everything else
on the ``aggregator`` of a three-sensor star of the hmd presets (shared 1.2 Gb/s bus). Most
tests serve it in process over the loopback transport; one starts real `edgesplit serve`
processes (three sensors and the aggregator) and drives them with `edgesplit run --source`.
"""

from __future__ import annotations

import json
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest
import torch
from torch import nn
from typer.testing import CliRunner

from edgesplit.cli import app
from edgesplit.errors import ConfigError, RemoteError
from edgesplit.graph import INPUT, LayerGraph, capture, export_model
from edgesplit.hardware import LayerWork, estimator_for, get_topology, star
from edgesplit.plan import (
    PLAN_VERSION,
    Network,
    Plan,
    assemble_plan,
    load_plan,
    recompute_total,
    star_layout,
)
from edgesplit.quant import decode_tensor, encode_tensor
from edgesplit.runtime import PlanProgram
from edgesplit.runtime.proto import edgesplit_runtime_pb2 as pb
from edgesplit.runtime.proto import edgesplit_runtime_pb2_grpc as pb_grpc
from edgesplit.runtime.star import JOIN_KEY, StarClient, star_link
from helpers import Relay, free_port, server_for, wait_until

VIEWS, D = 3, 4
SENSORS = [f"sensor{v}" for v in range(VIEWS)]
TOL = 1e-5
runner = CliRunner()


class MultiView(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.branch = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(),
                                    nn.Conv2d(8, 8, 3, stride=2, padding=1), nn.ReLU())
        self.reduce = nn.ModuleList(nn.Conv2d(8, D, 1) for _ in range(VIEWS))
        self.head = nn.Sequential(nn.Conv2d(VIEWS * D, 16, 3, padding=1), nn.ReLU(),
                                  nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10))

    def forward(self, v0: torch.Tensor, v1: torch.Tensor, v2: torch.Tensor) -> torch.Tensor:
        zs = [reduce(self.branch(v)) for reduce, v in zip(self.reduce, (v0, v1, v2),
                                                          strict=True)]
        return self.head(torch.stack(zs, dim=2).flatten(1, 2))  # interlaced View-Fuse


def _views(seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(1, 1, 16, 16, generator=g) for _ in range(VIEWS)]


# ---- the plan -------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def module() -> MultiView:
    torch.manual_seed(0)
    return MultiView().eval()


@pytest.fixture(scope="module")
def model_file(module, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("star-model") / "multiview.pt2"
    torch.export.save(export_model(module, tuple(_views(0)), name="multiview"), str(path))
    return path


@pytest.fixture(scope="module")
def graph(model_file) -> LayerGraph:
    return capture(model_file)


def _placement(graph: LayerGraph) -> dict[str, list[str]]:
    """Each layer that depends on one view alone on that view's sensor; the rest (fusion and
    head) on the aggregator."""
    views: dict[str, set[str]] = {}
    for layer in graph.layers:
        views[layer.name] = set().union(*(
            {t} if graph.tensors[t].producer == INPUT else views[graph.tensors[t].producer]
            for t in layer.inputs))
    placement = {s: [n for n, vs in views.items() if vs == {f"v{i}"}]
                 for i, s in enumerate(SENSORS)}
    placement["aggregator"] = [n for n, vs in views.items() if len(vs) > 1]
    return placement


def _star_plan(graph: LayerGraph, source: Path, **options) -> Plan:
    hmd = get_topology("hmd-star")
    topology = star("hmd-3", [hmd.device(s) for s in SENSORS], hmd.device("aggregator"),
                    hmd.link("sensor0", "aggregator"))
    order = [*SENSORS, "aggregator"]
    layer_ms = {layer.name: {d: estimator_for(topology.device(d)).layer_ms(
        LayerWork.of(graph, layer.name), topology.device(d)) for d in order}
        for layer in graph.layers}
    return assemble_plan(graph, _placement(graph), Network.of_topology(topology, order),
                         layer_ms=layer_ms, method="manual", source=str(source),
                         edge_memory_bytes=0, parallel_devices=SENSORS, **options)


@pytest.fixture(scope="module")
def plan(graph, model_file) -> Plan:
    return _star_plan(graph, model_file,
                      input_devices={f"v{i}": s for i, s in enumerate(SENSORS)})


@pytest.fixture(scope="module")
def program(plan, graph) -> PlanProgram:
    return PlanProgram.load(plan, graph)


def test_the_plan_prices_each_sensors_reduced_feature_and_no_view(plan, graph):
    reduced = {s: graph.layer(f"reduce.{i}").outputs[0] for i, s in enumerate(SENSORS)}
    sent = [t for t in plan.transfers if t.tensors]
    assert [(t.src, t.dst, t.tensors) for t in sent] == \
        [(s, "aggregator", [reduced[s]]) for s in SENSORS]
    assert not {"v0", "v1", "v2"} & {n for t in plan.transfers for n in t.tensors}
    bus = plan.links[0].link
    assert bus.shared  # three sensors split the bus: each gets a third of it
    for t in sent:
        assert t.ms == pytest.approx(bus.transfer_ms(t.bytes, senders=VIEWS))
    # T_sen + T_comm of the slowest sensor, then T_agg
    compute = plan.predicted.compute_ms
    slowest = max(compute[t.src] + t.ms + t.latency_ms + t.serialize_ms for t in sent)
    assert plan.predicted.total_ms == pytest.approx(slowest + compute["aggregator"])
    assert recompute_total(plan) == pytest.approx(plan.predicted.total_ms)
    assert (plan.shape, plan.runnable) == ("star", True)
    layout = star_layout(plan)
    assert (layout.sources, layout.sink) == (tuple(SENSORS), "aggregator")
    assert layout.inputs == {s: (f"v{i}",) for i, s in enumerate(SENSORS)}
    assert Plan.model_validate_json(plan.to_json()).shape == "star"  # no new field


def test_inputs_born_on_the_first_device_make_no_star(graph, model_file):
    """The views then travel from sensor0 to the other sensors (back through the aggregator):
    a parallel plan the runtime does not execute."""
    plan = _star_plan(graph, model_file)
    assert any(t.src == "aggregator" and t.tensors for t in plan.transfers)
    assert (plan.shape, plan.runnable) == ("mesh", False)
    with pytest.raises(ConfigError, match="sources send only to its sink"):
        star_layout(plan)
    with pytest.raises(ConfigError, match="best_chain"):
        PlanProgram.load(plan, graph)
    with pytest.raises(ConfigError, match="not inputs of"):
        _star_plan(graph, model_file, input_devices={"x": "sensor0"})
    with pytest.raises(ConfigError, match="not devices of the network"):
        _star_plan(graph, model_file, input_devices={"v0": "camera"})


def test_a_planned_mesh_is_no_star_but_runs_as_a_mesh():
    """Issue 39: a mesh of the planner's shape now runs (tests/runtime/test_runtime_mesh.py)."""
    from edgesplit.plan import PlanningProblem, get_planner
    from mesh_models import TwoHeads, _mesh

    problem = PlanningProblem(TwoHeads(), _mesh(2.0, 1.0, rtt_ms=0.0),
                              example_inputs=torch.randn(1, 3, 16, 16))
    plan = get_planner("multisplit").plan(problem)
    assert plan.parallel_devices and (plan.shape, plan.runnable) == ("mesh", True)
    assert PlanProgram.load(plan, problem.graph).kind == "mesh"


# ---- the program ----------------------------------------------------------------------------
def test_program_steps_and_run_local_equal_the_model(program, module, graph):
    assert (program.kind, program.sources, program.sink) == ("star", tuple(SENSORS),
                                                             "aggregator")
    reduced = [graph.layer(f"reduce.{i}").outputs[0] for i in range(VIEWS)]
    for i, s in enumerate(SENSORS):
        step = program.step(s)
        assert (step.receives, step.sends) == ((f"v{i}",), (reduced[i],))
        assert program.next_device(step) == "aggregator"
    sink = program.step("aggregator")
    assert (sink.receives, sink.sends, sink.returns) == (tuple(reduced), (), ("linear",))
    manifest = program.manifest()
    assert (manifest["kind"], manifest["sink"]) == ("star", "aggregator")
    # link emulation gives each sensor its share of the bus, as the plan prices it
    assert star_link(program, "sensor0").bandwidth_mbps == pytest.approx(1200.0 / VIEWS)
    for seed in range(3):
        xs = _views(seed)
        got, timings = program.run_local(xs)
        assert torch.allclose(got[0], program.unsplit(xs)[0], atol=TOL)
        with torch.no_grad():
            assert torch.allclose(got[0], module(*xs), atol=TOL)
        assert set(timings) == {"compute", "serialize"}


# ---- served in process ----------------------------------------------------------------------
class Star:
    """An aggregator and three sensor servers, reached over the loopback transport."""

    def __init__(self, program: PlanProgram, **sink_options) -> None:
        self.sink = server_for(program, "aggregator", shape=False, **sink_options)
        self.sink_channel = self.sink.loopback_channel()
        self.sensors = {s: server_for(program, s, next_address=self.sink_channel,
                                      shape=False) for s in SENSORS}
        self.channels = {s: server.loopback_channel() for s, server in self.sensors.items()}


@pytest.fixture(scope="module")
def served(program) -> Star:
    return Star(program)


def test_star_client_equals_the_unsplit_model(program, served):
    before = served.sink.handler.join.computed
    with StarClient(program, served.channels, timeout_s=30) as client:
        for seed in range(3):
            xs = _views(seed)
            result = client.request(xs)
            assert torch.allclose(result.outputs[0], program.unsplit(xs)[0], atol=TOL)
    assert set(result.breakdown_ms) == {"edge", "serialize", "transfer", "remote", "total"}
    assert {f"{s}.compute_ms" for s in SENSORS} | {"aggregator.compute_ms"} <= \
        set(result.hops_ms)
    assert served.sink.handler.join.computed - before == 3  # one computation per request
    assert served.sink.handler.join.pending == 0


def test_a_star_gives_every_rows_outputs_back_in_order(program, served):
    """Rows of every view through the star (issue 55, 3): StarClient.infer, and run_requests
    collecting outputs from two clients, equal the unsplit model row by row."""
    from edgesplit.runtime.outputs import OutputCollector, split_rows
    from edgesplit.runtime.session import run_requests

    rows = [torch.cat(views) for views in zip(*(_views(seed) for seed in range(4)),
                                              strict=True)]  # 4 rows of each of the views
    want = torch.cat([program.unsplit(_views(seed))[0] for seed in range(4)])
    with StarClient(program, served.channels, timeout_s=30) as client:
        (got,) = client.infer(rows)
    assert torch.allclose(got, want, atol=TOL)
    batches = split_rows(program, rows)
    collector = OutputCollector(program, batches)
    report = run_requests(program, served.channels, requests=4, concurrency=2, inputs=batches,
                          client_options={"timeout_s": 30}, on_result=collector.add)
    outputs = collector.result(program.unsplit)
    assert report["ok"] == 4 and bool(outputs.answered.all())
    assert torch.allclose(outputs.values[0], want, atol=TOL)
    assert float(outputs.max_abs_diff.max()) <= TOL


def test_concurrent_requests_come_back_matched_and_exact(program, served):
    before = served.sink.handler.join.computed
    with StarClient(program, served.channels, timeout_s=30) as client:
        def one(seed: int) -> float:
            xs = _views(seed)
            return float((client.request(xs).outputs[0] - program.unsplit(xs)[0]).abs().max())

        with ThreadPoolExecutor(6) as pool:
            diffs = list(pool.map(one, range(24)))
    assert max(diffs) <= TOL
    assert served.sink.handler.join.computed - before == 24
    assert served.sink.handler.join.pending == 0


def test_the_token_travels_from_the_sources_to_the_sink(program):
    sink = server_for(program, "aggregator", shape=False, token="t0ken")
    channel = sink.loopback_channel()
    channels = {s: server_for(program, s, next_address=channel, shape=False,
                              token="t0ken").loopback_channel() for s in SENSORS}
    with StarClient(program, channels, token="t0ken", timeout_s=10) as client:
        xs = _views(8)
        assert torch.allclose(client.request(xs).outputs[0], program.unsplit(xs)[0], atol=TOL)
    with (StarClient(program, channels, token="wrong", timeout_s=10) as client,
          pytest.raises(RemoteError, match="UNAUTHENTICATED")):
        client.request(_views(8))


def test_the_client_needs_every_source_and_only_sources(program, served):
    with pytest.raises(ConfigError, match=r"no address for source.*sensor2"):
        StarClient(program, {s: served.channels[s] for s in SENSORS[:2]})
    with pytest.raises(ConfigError, match=r"\['aggregator'\] are not sources"):
        StarClient(program, {**served.channels, "aggregator": served.sink_channel})


# ---- hostile input at the sink --------------------------------------------------------------
def _sent(program: PlanProgram, xs: list[torch.Tensor]) -> dict[str, pb.Bundle]:
    """What each sensor sends the aggregator for views ``xs``, by sensor (request id 7)."""
    values = program.input_values(xs)
    out = {}
    for s in SENSORS:
        step = program.step(s)
        computed = step.compute({t: values[t] for t in step.receives})
        bundle = pb.Bundle(plan_id=program.plan_id, plan_version=PLAN_VERSION, request_id=7)
        for name, data in program.encode(step, computed, step.sends).items():
            bundle.tensors.add(name=name, data=data)
        out[s] = bundle
    return out


def _call(channel, bundle: pb.Bundle, key: str | None = "k", timeout: float = 10.0):
    metadata = [(JOIN_KEY, key)] if key is not None else []
    return pb_grpc.PartitionServiceStub(channel).Run(bundle, timeout=timeout,
                                                     metadata=metadata)


def _in_background(fn, *args):
    """Run ``fn(*args)`` on a thread; the returned function waits and gives its result or
    the exception it raised."""
    box: list = []
    thread = threading.Thread(target=lambda: box.append(_outcome(fn, *args)), daemon=True)
    thread.start()
    return lambda: (thread.join(15), box[0])[1]


def _outcome(fn, *args):
    try:
        return fn(*args)
    except grpc.RpcError as exc:
        return exc


def test_a_missing_view_times_out_naming_it_and_the_join_is_dropped(program):
    star = Star(program, join_timeout_s=0.3)
    sent = _sent(program, _views(1))
    waits = [_in_background(_call, star.sink_channel, sent[s], "lost") for s in SENSORS[:2]]
    for wait in waits:
        exc = wait()
        assert isinstance(exc, grpc.RpcError)
        assert exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        missing = program.step("sensor2").sends[0]
        assert f"['{missing}'] from sensor2 never arrived" in exc.details()
        assert "dropped" in exc.details()
    assert star.sink.handler.join.pending == 0 and star.sink.handler.join.computed == 0
    late = _outcome(_call, star.sink_channel, sent["sensor2"], "lost")  # too late: told so
    assert late.code() == grpc.StatusCode.DEADLINE_EXCEEDED and "is over" in late.details()


def test_a_caller_deadline_shorter_than_the_join_timeout_ends_the_wait(program, served):
    sent = _sent(program, _views(2))
    exc = _outcome(_call, served.sink_channel, sent["sensor0"], "short", 0.3)
    assert exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED and "sensor1, sensor2" in \
        exc.details()
    assert served.sink.handler.join.pending == 0


def test_a_duplicate_tensor_fails_alone_and_the_join_still_completes(program, served):
    xs = _views(3)
    sent = _sent(program, xs)
    first = _in_background(_call, served.sink_channel, sent["sensor0"], "dup")
    # the first call is in the table
    assert wait_until(lambda: served.sink.handler.join.pending == 1)
    again = _outcome(_call, served.sink_channel, sent["sensor0"], "dup")
    assert again.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert program.step("sensor0").sends[0] in again.details() and "twice" in again.details()
    rest = [_in_background(_call, served.sink_channel, sent[s], "dup") for s in SENSORS[1:]]
    replies = [first(), *(wait() for wait in rest)]
    want = program.unsplit(xs)[0]
    for reply in replies:
        assert isinstance(reply, pb.Bundle) and reply.request_id == 7
        assert torch.allclose(decode_tensor(reply.tensors[0].data), want, atol=TOL)
    # the answered key is never computed again
    once_more = _outcome(_call, served.sink_channel, sent["sensor1"], "dup")
    assert once_more.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "has been answered" in once_more.details()


def test_unknown_tensors_a_missing_key_and_a_foreign_plan_are_refused(program, served):
    sent = _sent(program, _views(4))
    stray = pb.Bundle(plan_id=program.plan_id, plan_version=PLAN_VERSION, request_id=7)
    stray.tensors.add(name="v0", data=encode_tensor(_views(4)[0], 32))
    exc = _outcome(_call, served.sink_channel, stray, "unknown")
    assert exc.code() == grpc.StatusCode.INVALID_ARGUMENT and "['v0']" in exc.details()
    empty = pb.Bundle(plan_id=program.plan_id, plan_version=PLAN_VERSION, request_id=7)
    assert _outcome(_call, served.sink_channel, empty, "none").code() == \
        grpc.StatusCode.INVALID_ARGUMENT
    exc = _outcome(_call, served.sink_channel, sent["sensor0"], None)
    assert exc.code() == grpc.StatusCode.INVALID_ARGUMENT and JOIN_KEY in exc.details()
    exc = _outcome(_call, served.sink_channel, sent["sensor0"], "x" * 500)
    assert exc.code() == grpc.StatusCode.INVALID_ARGUMENT and "at most" in exc.details()
    foreign = pb.Bundle()
    foreign.CopyFrom(sent["sensor0"])
    foreign.plan_id = "0123456789abcdef"
    exc = _outcome(_call, served.sink_channel, foreign, "foreign")
    assert exc.code() == grpc.StatusCode.FAILED_PRECONDITION and "plan mismatch" in \
        exc.details()
    assert served.sink.handler.join.pending == 0


def test_parts_beyond_the_table_bounds_are_refused_and_the_parked_joins_complete(program):
    """Issue 39: the table is bounded in joins, in joins one host opens (alone, half the
    table; issue 55: a host's share, not a connection's or a source's) and in parked bytes; a
    part past a bound is refused at once (it used to evict the oldest join, which let a flood
    end legitimate ones), and what is parked completes."""
    star = Star(program, max_joins=4, join_timeout_s=10)
    join = star.sink.handler.join
    sent = _sent(program, _views(5))
    waits = {key: [_in_background(_call, star.sink_channel, sent["sensor0"], key)]
             for key in "ab"}
    assert wait_until(lambda: join.pending == 2)
    exc = _outcome(_call, star.sink_channel, sent["sensor0"], "c")  # sensor0's half is full
    assert exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "source sensor0 from loopback has 2 requests waiting" in exc.details()
    # sensor1 opens c and d from two other hosts (one host's share of four is two, then one)
    waits.update({key: [_in_background(_call, star.sink.loopback_channel(f"ipv4:10.0.0.{i}:1"),
                                       sent["sensor1"], key)] for i, key in ((2, "c"), (3, "d"))})
    assert wait_until(lambda: join.pending == 4)
    exc = _outcome(_call, star.sink_channel, sent["sensor2"], "e")  # the table is full
    assert exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "4 requests are waiting for their sources already" in exc.details()
    assert (join.parked, join.busy) == (4, 0)
    for key, calls in waits.items():  # the parked joins complete
        missing = ["sensor1", "sensor2"] if key in "ab" else ["sensor0", "sensor2"]
        calls += [_in_background(_call, star.sink_channel, sent[s], key) for s in missing]
    assert all(isinstance(wait(), pb.Bundle) for calls in waits.values() for wait in calls)
    assert (join.computed, join.pending, join.parked, join.parked_bytes) == (4, 0, 0, 0)
    join.max_bytes = 1  # and a part over the parked bytes' bound
    exc = _outcome(_call, star.sink_channel, sent["sensor0"], "f")
    assert exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "bytes are parked" in \
        exc.details()
    assert join.pending == 0


# ---- workers: a waiting join holds none (issue 39) ------------------------------------------
def _own_inputs(program: PlanProgram, xs: list[torch.Tensor], source: str, request_id: int
                ) -> pb.Bundle:
    """What a client sends ``source``: its own view."""
    bundle = pb.Bundle(plan_id=program.plan_id, plan_version=PLAN_VERSION,
                       request_id=request_id)
    for name in program.step(source).receives:
        bundle.tensors.add(name=name, data=encode_tensor(program.input_values(xs)[name], 32))
    return bundle


def test_a_one_source_flood_parks_holding_no_worker_and_a_complete_join_goes_through(program):
    """The sink serves real gRPC with one worker: parts of many requests from one source park
    in the table (each used to hold one of the sink's three threads until its join timed
    out, so the complete join below queued behind them and failed); past half the table that
    host's new joins are refused (issue 55: a host's, whatever connections it uses; this
    test's legitimate caller was another connection on the same host), and sensor0 on another
    host still opens one."""
    sink = server_for(program, "aggregator", shape=False, max_workers=1, max_joins=16,
                      join_timeout_s=60)
    address = f"127.0.0.1:{sink.start()}"
    channel = grpc.insecure_channel(address)
    # a sensor's server on another host (a relay from 127.0.0.2)
    relay = Relay(sink.port, "127.0.0.2")
    own = grpc.insecure_channel(relay.address)
    try:
        xs = _views(10)
        sent = _sent(program, xs)
        flood = [_in_background(_call, channel, sent["sensor0"], f"flood{i}", 60)
                 for i in range(10)]
        assert wait_until(lambda: sink.handler.join.pending == 8 and sink.handler.join.parked == 8)
        assert sink.handler.join.busy == 0  # parked: no worker held
        legit = [_in_background(_call, own, sent["sensor0"], "legit", 30)]
        assert wait_until(lambda: sink.handler.join.pending == 9)
        legit += [_in_background(_call, own, sent[s], "legit", 30) for s in SENSORS[1:]]
        want = program.unsplit(xs)[0]
        for wait in legit:
            reply = wait()
            assert isinstance(reply, pb.Bundle), reply
            assert torch.allclose(decode_tensor(reply.tensors[0].data), want, atol=TOL)
        join = sink.handler.join
        assert (join.computed, join.pending, join.busy) == (1, 8, 0)
    finally:
        sink.stop(5)  # the parked flood is told the sink is going away (issue 39, 2)
        channel.close()
        own.close()
        relay.close()
    codes = [wait().code() for wait in flood]
    assert sorted(c.name for c in codes) == ["RESOURCE_EXHAUSTED"] * 2 + ["UNAVAILABLE"] * 8


def test_sources_with_one_worker_each_do_not_wait_on_each_other(program):
    """sensor0 serves request A and sensor1 request B, one worker each; A's part from sensor1
    and B's from sensor0 arrive next. A source's call used to hold its only worker while the
    sink waited for the other parts, which queued behind it: a circular wait until the join
    timed out. Now a source holds its worker while it computes only."""
    sink = server_for(program, "aggregator", shape=False, max_workers=1, max_joins=8,
                      join_timeout_s=60)
    sink_address = f"127.0.0.1:{sink.start()}"
    sensors = {s: server_for(program, s, next_address=sink_address, shape=False,
                             max_workers=1, max_joins=8) for s in SENSORS}
    channels = {s: grpc.insecure_channel(f"127.0.0.1:{server.start()}")
                for s, server in sensors.items()}
    try:
        views = {"A": _views(11), "B": _views(12)}
        def send(source: str, key: str):
            bundle = _own_inputs(program, views[key], source, 1 if key == "A" else 2)
            return _in_background(_call, channels[source], bundle, key, 30)

        calls = [send("sensor0", "A")]
        assert wait_until(lambda: sink.handler.join.pending == 1)
        calls.append(send("sensor1", "B"))
        assert wait_until(lambda: sink.handler.join.pending == 2)
        calls += [send("sensor1", "A"), send("sensor0", "B"), send("sensor2", "A"),
                  send("sensor2", "B")]
        replies = [wait() for wait in calls]
        for reply in replies:
            assert isinstance(reply, pb.Bundle), reply
            key = "A" if reply.request_id == 1 else "B"
            assert torch.allclose(decode_tensor(reply.tensors[0].data),
                                  program.unsplit(views[key])[0], atol=TOL)
        join = sink.handler.join
        assert (join.computed, join.pending, join.busy) == (2, 0, 0)
    finally:
        for server in (*sensors.values(), sink):
            server.stop(0)
        for channel in channels.values():
            channel.close()


def test_a_stopping_server_answers_unavailable_not_resource_exhausted(program):
    """A call waiting for a worker while its server stops is told UNAVAILABLE (retry
    elsewhere), not RESOURCE_EXHAUSTED once its deadline passes; a part reaching a stopped
    sink too."""
    from edgesplit.transport import BadRequest
    from edgesplit.transport.loopback import LoopbackContext

    server = server_for(program, "sensor0", next_address="127.0.0.1:1", shape=False,
                        max_workers=1)
    compute = server.handler.compute
    while server.slots._slots.take(0):  # every data-plane slot busy
        pass
    assert compute.computing is not None and compute.computing.take(0)  # and the worker
    waiting = [_in_background(_raised, server.take_slot, LoopbackContext(timeout=30)),
               _in_background(_raised, compute.compute, {}, LoopbackContext(timeout=30), {})]
    assert wait_until(lambda: server.slots._slots._waiting == 1 and compute.computing._waiting == 1)
    server.stop(0)
    for wait in waiting:
        exc = wait()
        assert isinstance(exc, BadRequest) and exc.code == grpc.StatusCode.UNAVAILABLE
        assert "shutting down" in str(exc)
    star = Star(program)
    star.sink.stop(0)
    exc = _outcome(_call, star.sink_channel, _sent(program, _views(13))["sensor0"], "late")
    assert exc.code() == grpc.StatusCode.UNAVAILABLE and "shutting down" in exc.details()


def _raised(fn, *args):
    try:
        return fn(*args)
    except Exception as exc:
        return exc


def test_a_star_sink_batches_and_a_source_needs_the_sink(program):
    """Issue 39, 2: the sink batches complete joins (it used to refuse --max-batch)."""
    sink = server_for(program, "aggregator", max_batch=4)
    assert sink.handler.batcher is not None and sink.handler.batcher.max_batch == 4
    sink.stop(0)
    with pytest.raises(ConfigError, match="sends to 'aggregator': give its address"):
        server_for(program, "sensor0")


def test_a_source_down_fails_the_request_naming_it(program):
    """sensor2's address has no server: the request fails at once, naming that source (the
    other sources' calls wait at the sink until its join timeout)."""
    star = Star(program, join_timeout_s=1)
    addresses = {**star.channels, "sensor2": f"127.0.0.1:{free_port()}"}
    with StarClient(program, addresses, timeout_s=5) as client:
        with pytest.raises(RemoteError, match=r"source sensor2: server .* is unavailable"):
            client.check_plan()
        client._plan_checked = True  # the request itself must name the source too
        with pytest.raises(RemoteError, match=r"source sensor2: server .* is unavailable"):
            client.request(_views(6))


# ---- real processes -------------------------------------------------------------------------
def test_cli_refuses_missing_and_unknown_sources(plan, tmp_path):
    path = tmp_path / "star.json"
    plan.save(path)
    for args, message in [([], "no address for source"),
                          (["--source", "sensor0=h:1", "--source", "sensor1=h:2"],
                           "no address for source(s) sensor2"),
                          ([f"--source={s}=h:1" for s in SENSORS] + ["--source", "cam=h:1"],
                           "not sources of this star plan"),
                          (["--source", "sensor0"], "NAME=HOST:PORT"),
                          (["--server", "h:1"], "this plan is a star")]:
        result = runner.invoke(app, ["run", str(path), *args])
        assert result.exit_code == 2, result.output
        assert message in result.output and "Traceback" not in result.output
        assert len(result.output.strip().splitlines()) <= 3  # one (wrapped) line


@pytest.mark.xdist_group("runtime")
def test_star_served_by_processes_equals_the_unsplit_model(plan, program, tmp_path):
    from test_runtime import ServerProc

    path = tmp_path / "star.json"
    plan.save(path)
    assert load_plan(path).shape == "star"
    port = free_port()  # the sensors start beside the aggregator, pointed at its port
    aggregator = ServerProc(path, "aggregator", "--no-shape", log_dir=tmp_path, port=port)
    sensors = {}
    try:
        for s in SENSORS:
            sensors[s] = ServerProc(path, s, "--no-shape", "--next", f"127.0.0.1:{port}",
                                    log_dir=tmp_path)
        assert aggregator.address == f"127.0.0.1:{port}"
        result = runner.invoke(app, ["run", str(path), "--no-shape", "-n", "6", "-c", "2",
                                     "--timeout-s", "30", "--json",
                                     *(f"--source={s}={p.address}" for s, p in sensors.items())])
        assert result.exit_code == 0, result.output
        doc = json.loads(result.stdout)
        assert (doc["ok"], doc["errors"]) == (6, 0)
        assert doc["max_abs_diff"] <= TOL
        assert (doc["sources"], doc["sink"]) == (SENSORS, "aggregator")
        assert doc["predicted_ms"] == pytest.approx(plan.predicted.total_ms)
        b = doc["predicted_breakdown_ms"]
        assert b["edge"] + b["serialize"] + b["transfer"] + b["remote"] == pytest.approx(
            b["total"])
        # and from Python, on other inputs
        with StarClient(program, {s: p.address for s, p in sensors.items()},
                        timeout_s=30) as client:
            xs = _views(9)
            assert torch.allclose(client.request(xs).outputs[0], program.unsplit(xs)[0],
                                  atol=TOL)
    finally:
        for proc in (*sensors.values(), aggregator):
            proc.kill()

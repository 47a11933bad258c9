"""Mesh plans (JMSNAS Fig. 2b) served: a chain to a root that broadcasts to parallel branch
devices, whose outputs an aggregator joins (star.py's Join) before the rest of the chain.

The plan is what the JMSNAS mesh planner (``multisplit`` over a ``mesh`` topology) makes of
``TwoHeads`` (a stem, two independent branches, their sum and a head): ``ue`` relays the
input, ``root`` runs the stem, ``b0`` and ``b1`` one branch each, ``agg`` the sum and the head.
Every device after the first is a partition server on its own port; the client is the usual
``ChainClient``. Parallelism and failures are shown with an instrumented backend on the
branches, never with wall-clock times.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import pytest
import torch

from edgesplit.errors import ConfigError, RemoteError
from edgesplit.hardware import Link, mesh
from edgesplit.hardware.topology import Topology, TopologyLink
from edgesplit.plan import (
    Network,
    Plan,
    PlanningProblem,
    assemble_plan,
    get_planner,
    mesh_layout,
)
from edgesplit.runtime import PlanProgram
from edgesplit.runtime.backends import TorchBackend
from edgesplit.runtime.client import ChainClient
from edgesplit.runtime.shell import ServingShell
from helpers import server_for, wait_until
from mesh_models import TwoHeads, _device, _mesh

TOL = 1e-5
BRANCHES = ("b0", "b1")


def _input(seed: int) -> torch.Tensor:
    return torch.randn(1, 3, 16, 16, generator=torch.Generator().manual_seed(seed))


@pytest.fixture(scope="module")
def problem() -> PlanningProblem:
    torch.manual_seed(0)
    return PlanningProblem(TwoHeads().eval(), _mesh(2.0, 1.0, rtt_ms=0.0),
                           example_inputs=_input(0))


@pytest.fixture(scope="module")
def plan(problem) -> Plan:
    return get_planner("multisplit").plan(problem)


@pytest.fixture
def program(plan, problem) -> PlanProgram:
    """A fresh program per test: tests swap the branches' backends."""
    return PlanProgram.load(plan, problem.graph)


def test_the_planners_mesh_is_runnable_with_its_roles(plan, program):
    assert (plan.shape, plan.runnable) == ("mesh", True)
    layout = mesh_layout(plan)
    assert (layout.head, layout.branches, layout.aggregator, layout.tail) == \
        (("ue", "root"), BRANCHES, "agg", ())
    assert (program.kind, program.root, program.sources, program.sink) == \
        ("mesh", "root", BRANCHES, "agg")
    stem = program.step("root").sends
    for b in BRANCHES:
        assert program.step(b).receives == stem  # the root broadcasts its output
        assert program.next_device(program.step(b)) == "agg"
    assert program.next_device(program.step("root")) is None  # it sends to every branch
    assert program.manifest()["branches"] == list(BRANCHES)
    for seed in range(2):
        got, _ = program.run_local([_input(seed)])
        assert torch.allclose(got[0], program.unsplit([_input(seed)])[0], atol=TOL)


# ---- served, one server per device on its own port ------------------------------------------
class Mesh:
    """root, b0, b1 and agg serving on ports; ``client()`` drives them from ue."""

    def __init__(self, program: PlanProgram, agg_options: Mapping[str, Any] | None = None,
                 **root_options: Any) -> None:
        self.program = program
        self.agg = server_for(program, "agg", **(agg_options or {}))
        agg = f"127.0.0.1:{self.agg.start()}"
        self.branches = {b: server_for(program, b, next_address=agg) for b in BRANCHES}
        at = {b: f"127.0.0.1:{s.start()}" for b, s in self.branches.items()}
        self.root = server_for(program, "root", next_address=at, **root_options)
        self.address = f"127.0.0.1:{self.root.start()}"

    def client(self, **options: Any) -> ChainClient:
        return ChainClient(self.program, self.address, **{"timeout_s": 20.0, **options})

    def stop(self) -> None:
        for server in (self.root, *self.branches.values(), self.agg):
            server.stop(0)


@pytest.fixture
def served(program) -> Iterator[Mesh]:
    m = Mesh(program)
    yield m
    m.stop()


class Hooked(TorchBackend):
    """The torch backend, with ``hook(step)`` run inside every branch compute first."""

    def __init__(self, hook: Callable[[str], None]) -> None:
        super().__init__()
        self.hook = hook
        self.finished: list[str] = []  # the branches that finished computing

    def run(self, step, values: Mapping[str, torch.Tensor], state: Any
            ) -> dict[str, torch.Tensor]:
        self.hook(step.name)
        out = super().run(step, values, state)
        self.finished.append(step.name)
        return out


def _hook_branches(program: PlanProgram, hook: Callable[[str], None]) -> Hooked:
    backend = Hooked(hook)
    for b in BRANCHES:
        program.step(b).backend = backend
    return backend


def test_served_mesh_equals_the_unsplit_model(program, served):
    with served.client() as client:
        for seed in range(3):
            result = client.request([_input(seed)])
            assert torch.allclose(result.outputs[0], program.unsplit([_input(seed)])[0],
                                  atol=TOL)
    assert {f"{d}.compute_ms" for d in ("root", *BRANCHES, "agg")} <= set(result.hops_ms)
    assert served.agg.handler.join.computed == 3 and served.agg.handler.join.pending == 0


def test_the_branches_compute_at_the_same_time(program, served):
    """Each branch waits inside its compute until the other is inside too (or 10 s): the
    peak is 2 only if the root broadcast to both before either answered."""
    inside, peak = [0], [0]
    both = threading.Condition()

    def meet(_: str) -> None:
        with both:
            inside[0] += 1
            peak[0] = max(peak[0], inside[0])
            both.notify_all()
            both.wait_for(lambda: peak[0] >= 2, timeout=10)
        with both:
            inside[0] -= 1

    _hook_branches(program, meet)
    with served.client() as client:
        result = client.request([_input(5)])
    assert peak[0] == 2
    assert torch.allclose(result.outputs[0], program.unsplit([_input(5)])[0], atol=TOL)


def test_a_failing_branch_fails_the_request_cleanly(program):
    """The root cancels b0's call when b1 fails: its part parked at the aggregator is dropped
    then, not at the join timeout (a minute here)."""
    served = Mesh(program, {"join_timeout_s": 60.0})
    try:
        _fail_one_branch(program, served)
    finally:
        served.stop()


def _fail_b1_once_b0_is_parked(agg: ServingShell) -> Callable[[str], None]:
    """A hook failing b1 once b0's part waits at the aggregator: only a cancellation of b0's
    call, which the root makes when b1 fails, drops that part before the join timeout."""
    def fail(name: str) -> None:
        if name == "b1":
            assert wait_until(lambda: agg.handler.join.pending == 1)
            raise RuntimeError("branch exploded")

    return fail


def _fail_one_branch(program: PlanProgram, served: Mesh) -> None:
    _hook_branches(program, _fail_b1_once_b0_is_parked(served.agg))
    with served.client() as client, \
            pytest.raises(RemoteError, match=r"(?s)'b1' failed.*branch exploded"):
        client.request([_input(1)])
    # b0's part, parked at the aggregator, is dropped when the root cancels its call
    assert wait_until(lambda: served.agg.handler.join.pending == 0)
    assert (served.agg.handler.join.computed, served.agg.handler.join.busy) == (0, 0)
    _hook_branches(program, lambda _: None)  # the mesh serves the next request
    with served.client() as client:
        assert torch.allclose(client.request([_input(2)]).outputs[0],
                              program.unsplit([_input(2)])[0], atol=TOL)


def test_a_branch_past_the_deadline_is_deadline_exceeded_and_leaves_no_join(program):
    """The root gives its branches 0.5 s (the client 20): b1 never answers in time, so the
    root answers DEADLINE_EXCEEDED (the client's sentence for it: "did not answer in time"),
    b0's part parked at the aggregator is dropped, and b1's late result goes nowhere."""
    served = Mesh(program, next_timeout_s=0.5)
    release = threading.Event()
    backend = _hook_branches(program, lambda name: name == "b1" and release.wait(20) and None)
    try:
        with served.client() as client, \
                pytest.raises(RemoteError, match="did not answer in time"):
            client.request([_input(3)])
        assert wait_until(lambda: served.agg.handler.join.pending == 0)
        release.set()  # b1 finishes computing for a caller that left: nothing is forwarded
        assert wait_until(lambda: "b1" in backend.finished)
        assert served.agg.handler.join.pending == 0 and served.agg.handler.join.computed == 0
        assert (served.agg.handler.join.busy, served.agg.handler.join.parked) == (0, 0)
    finally:
        release.set()
        served.stop()


def test_the_root_shapes_each_branch_link_as_the_plan_prices_it(program, plan):
    root = server_for(program, "root", shape=True,
                      next_address={b: "127.0.0.1:1" for b in BRANCHES})
    links = {(pl.src, pl.dst): pl.link for pl in plan.links}
    assert {b: s.link for b, s in root.handler.next_hop.shapers.items()} == \
        {b: links["root", b] for b in BRANCHES}
    assert all(s.enabled for s in root.handler.next_hop.shapers.values())
    assert not root.handler.downstream.enabled  # the fan-out shapes, not the server's one link
    root.stop(0)


def test_the_root_needs_every_branch_address(program):
    with pytest.raises(ConfigError, match=r"b0, b1.*missing: \['b1'\]"):
        server_for(program, "root", next_address={"b0": "127.0.0.1:1"})
    with pytest.raises(ConfigError, match="NAME=HOST:PORT"):
        server_for(program, "root", next_address="127.0.0.1:1")
    with pytest.raises(ConfigError, match="sends to one device"):
        server_for(program, "b0", next_address={"agg": "127.0.0.1:1"})


def test_the_ray_engine_does_not_serve_the_aggregator(program):
    from edgesplit.runtime.ray_engine import RayEngine

    with pytest.raises(ConfigError, match="a mesh's branches"):
        RayEngine(program, "agg")


def test_other_meshes_stay_refused_naming_the_supported_shape(problem):
    """A mesh whose root also sends straight to the aggregator is not of the shape."""
    fast = Link(name="fast", bandwidth_mbps=10_000.0, rtt_ms=0.0)
    topology = mesh("m", [_device("ue", 0.5)], [fast], _device("root", 1.0),
                    [_device(f"b{i}", 2.0) for i in range(2)], fast, _device("agg", 0.5), fast)
    plan = get_planner("multisplit").plan(PlanningProblem(problem.model, topology,
                                                          example_inputs=_input(0)))
    assert plan.shape == "mesh"
    bad = plan.model_copy(update={"transfers": [*plan.transfers, plan.transfers[-1].model_copy(
        update={"src": "root", "dst": "agg"})]})
    assert not bad.runnable
    with pytest.raises(ConfigError, match=r"a chain of devices to one root.*root sends to agg"):
        mesh_layout(bad)
    with pytest.raises(ConfigError, match=r"(?s)a chain of devices to one root.*best_chain"):
        PlanProgram.load(bad, problem.graph)


# ---- a root that is the first device, and a chain after the aggregator ----------------------
@pytest.fixture(scope="module")
def tailed(problem) -> PlanProgram:
    """root (the client) -> b0, b1 -> agg -> tail, placed by hand: the stem on the root, a
    branch on each branch device, the sum on the aggregator, the head on the tail."""
    fast = Link(name="fast", bandwidth_mbps=10_000.0, rtt_ms=0.0)
    names = ["root", *BRANCHES, "agg", "tail"]
    edges = [("root", "b0"), ("root", "b1"), ("b0", "agg"), ("b1", "agg"), ("agg", "tail")]
    topology = Topology(name="tailed", devices=tuple(_device(n, 1.0) for n in names),
                        links=tuple(TopologyLink(src=a, dst=b, link=fast) for a, b in edges))
    graph = problem.graph
    placement = {"root": ["stem"], "b0": ["left.0", "left.2"], "b1": ["right.0"],
                 "agg": ["add"], "tail": ["head"]}
    plan = assemble_plan(graph, placement, Network.of_topology(topology, names),
                         layer_ms={layer.name: dict.fromkeys(names, 1.0)
                                   for layer in graph.layers},
                         method="manual", source="TwoHeads", edge_memory_bytes=0,
                         parallel_devices=list(BRANCHES))
    assert mesh_layout(plan).tail == ("tail",)
    return PlanProgram.load(plan, graph)


def test_a_root_client_and_a_chain_after_the_aggregator(tailed):
    got, _ = tailed.run_local([_input(4)])
    assert torch.allclose(got[0], tailed.unsplit([_input(4)])[0], atol=TOL)
    tail = server_for(tailed, "tail")
    agg = server_for(tailed, "agg", next_address=f"127.0.0.1:{tail.start()}")
    at = f"127.0.0.1:{agg.start()}"
    branches = {b: server_for(tailed, b, next_address=at) for b in BRANCHES}
    addresses = {b: f"127.0.0.1:{s.start()}" for b, s in branches.items()}
    agg.handler.join.timeout_s = 60.0  # b0's parked part can only go by the client's cancelling it
    try:
        with pytest.raises(ConfigError, match="NAME=HOST:PORT"):
            ChainClient(tailed, addresses["b0"])
        with ChainClient(tailed, addresses, timeout_s=20) as client:
            _hook_branches(tailed, _fail_b1_once_b0_is_parked(agg))
            with pytest.raises(RemoteError, match="branch exploded"):
                client.request([_input(0)])
            assert wait_until(lambda: agg.handler.join.pending == 0)
        for b in BRANCHES:
            tailed.step(b).backend = TorchBackend()
        with ChainClient(tailed, addresses, timeout_s=20) as client:
            for seed in range(2):
                result = client.request([_input(seed)])
                assert torch.allclose(result.outputs[0], tailed.unsplit([_input(seed)])[0],
                                      atol=TOL)
        assert {"agg.compute_ms", "tail.compute_ms"} <= set(result.hops_ms)
        join = agg.handler.join
        assert (join.computed, join.pending, join.busy) == (2, 0, 0)
    finally:
        for server in (*branches.values(), agg, tail):
            server.stop(0)


# ---- served by `edgesplit serve` processes, driven by `edgesplit run` -----------------------
@pytest.mark.xdist_group("runtime")
def test_mesh_served_by_processes_equals_the_unsplit_model(problem, plan, tmp_path):
    from typer.testing import CliRunner

    from edgesplit.cli import app
    from edgesplit.graph import export_model
    from edgesplit.plan import load_plan
    from test_runtime import ServerProc

    model = tmp_path / "twoheads.pt2"
    torch.export.save(export_model(problem.model, (_input(0),), name="twoheads"), str(model))
    path = tmp_path / "mesh.json"
    plan.model_copy(update={"model": plan.model.model_copy(update={"source": str(model)})}
                    ).save(path)
    assert load_plan(path).runnable
    runner = CliRunner()
    result = runner.invoke(app, ["serve", str(path), "--device", "root"])
    assert result.exit_code == 2 and "--next NAME=HOST:PORT for each of them" in \
        " ".join(result.output.split()), result.output
    procs = [ServerProc(path, "agg", log_dir=tmp_path)]
    try:
        agg = procs[0].address
        branches = [ServerProc(path, b, "--next", agg, log_dir=tmp_path) for b in BRANCHES]
        procs += branches
        nexts = [f"--next={b}={p.address}" for b, p in zip(BRANCHES, branches, strict=True)]
        procs.append(ServerProc(path, "root", *nexts, log_dir=tmp_path))
        result = runner.invoke(app, ["run", str(path), "--server", procs[-1].address,
                                     "-n", "4", "-c", "2", "--timeout-s", "30", "--json"])
        assert result.exit_code == 0, result.output
        doc = json.loads(result.stdout)
        assert (doc["ok"], doc["errors"]) == (4, 0) and doc["max_abs_diff"] <= TOL
        assert (doc["root"], doc["branches"], doc["aggregator"]) == ("root", list(BRANCHES),
                                                                     "agg")
        compute = plan.predicted.compute_ms  # one branch's compute is on the path, not both
        assert doc["predicted_breakdown_ms"]["remote"] == pytest.approx(
            compute["root"] + max(compute[b] for b in BRANCHES) + compute["agg"])
    finally:
        for proc in procs:
            proc.kill()

"""The torchscript backend: a partition called again with the same shapes runs as a checked
TorchScript trace, answering what the eager module answers; anything a trace could get wrong
stays eager. Every check compares against the eager module in the same run."""

from __future__ import annotations

import threading

import pytest
import torch
from torch import nn
from torch.fx import symbolic_trace

from edgesplit.hardware import get_device, get_link
from edgesplit.plan import EdgeCloudSetting, PlanningProblem, get_planner
from edgesplit.runtime import PlanProgram
from edgesplit.runtime.backends import TorchScriptBackend, get_backend
from edgesplit.runtime.batching import Batcher, flexible_step
from edgesplit.runtime.traced import MAX_TRACES, TRACE_AFTER, TracedRunner

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # see conftest


@pytest.fixture(scope="module")
def plan():
    setting = EdgeCloudSetting(edge=get_device("jetson-nano"), cloud=get_device("v100-server"),
                               link=get_link("4g"))
    return get_planner("manual", split_after=["down2.0"]).plan(
        PlanningProblem("digits_cnn", setting))


@pytest.fixture(scope="module")
def edge(plan):
    """digits_cnn's edge part as the runtime holds it (a partition's GraphModule)."""
    return PlanProgram.load(plan).steps[0].partition.module


class _Small(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.conv(x))


def test_a_repeated_signature_runs_traced_and_answers_as_eager(edge):
    torch.manual_seed(0)
    runner = TracedRunner(edge)
    assert runner.static
    for k in range(TRACE_AFTER + 3):
        xi = torch.randn(1, 1, 32, 32)
        with torch.no_grad():
            assert torch.equal(runner(xi)[0], edge(xi)[0])
        assert runner.traces == (1 if k + 1 >= TRACE_AFTER else 0)
    other = torch.randn(2, 1, 32, 32)  # another signature: eager until it too repeats
    with torch.no_grad():
        assert torch.equal(runner(other)[0], edge(other)[0])
    assert runner.traces == 1


def test_signatures_traced_are_capped(edge):
    runner = TracedRunner(edge)
    with torch.no_grad():
        for batch in range(1, MAX_TRACES + 3):
            for _ in range(TRACE_AFTER):
                runner(torch.randn(batch, 1, 32, 32))
    assert runner.traces == MAX_TRACES


def _branch(x: torch.Tensor) -> torch.Tensor:
    return x * 2 if float(x.sum()) > 0 else x - 1  # a Python branch on a value


torch.fx.wrap("_branch")  # one call in the FX graph: a trace would bake the branch in


class _Branchy(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _branch(x)


def test_a_trace_that_bakes_in_data_is_refused():
    gm = symbolic_trace(_Branchy())
    runner = TracedRunner(gm)
    with torch.no_grad():
        for _ in range(TRACE_AFTER + 1):
            assert torch.equal(runner(torch.ones(4)), torch.ones(4) * 2)
        assert runner.traces == 0
        negative = torch.full((4,), -3.0)  # the other branch: -4, where a baked one gives -6
        assert torch.equal(runner(negative), negative - 1)


def test_gradients_and_symbolic_shapes_stay_eager(edge):
    runner = TracedRunner(edge)
    for _ in range(TRACE_AFTER + 1):
        runner(torch.randn(1, 1, 32, 32, requires_grad=True))
    assert runner.traces == 0
    dynamic = torch.export.export(_Small().eval(), (torch.randn(2, 3, 8, 8),), dynamic_shapes=(
        {0: torch.export.Dim("batch", min=1, max=64)},)).module()
    assert not TracedRunner(dynamic).static


def test_torchscript_backend_runs_a_plan_as_torch_does(plan):
    eager = PlanProgram.load(plan)
    traced = PlanProgram.load(plan, backend="torchscript")
    assert isinstance(get_backend("torchscript"), TorchScriptBackend)
    inputs = [torch.randn(1, 1, 32, 32) for _ in range(TRACE_AFTER + 2)]
    for x in inputs:
        assert torch.equal(traced.run_local([x])[0][0], eager.run_local([x])[0][0])
    backend = traced.steps[0].backend
    assert isinstance(backend, TorchScriptBackend)
    assert all(backend.runner(s.partition.module).traces == 1 for s in traced.steps)


def test_torchscript_backend_batches_and_answers_threads_alike(plan):
    program = PlanProgram.load(plan, backend="torchscript")
    flexible = flexible_step(program, "cloud")
    assert not isinstance(flexible, str)
    batcher = Batcher(program.step("cloud"), flexible, max_batch=8, flexible=True)
    edge = program.steps[0]
    samples = [edge.compute(program.input_values([torch.randn(1, 1, 32, 32)]))
               for _ in range(16)]
    want = [program.step("cloud").compute(s) for s in samples]
    got: list = [None] * len(samples)

    def worker(i: int) -> None:
        for _ in range(3):
            got[i] = batcher.compute(samples[i])

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(samples))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    batcher.close()
    name = program.step("cloud").partition.outputs[0]
    for g, w in zip(got, want, strict=True):
        assert torch.allclose(g[name], w[name], atol=1e-5)
    batch = {n: torch.cat([s[n] for s in samples[:4]]) for n in flexible.partition.inputs}
    for _ in range(TRACE_AFTER + 1):  # a batch size that repeats runs traced, as eager does
        out = flexible.compute(batch)
    assert flexible.backend.runner(flexible.partition.module).traces >= 1
    eager = flexible.partition.module(*(batch[n] for n in flexible.partition.inputs))[0]
    assert torch.equal(out[name], eager)

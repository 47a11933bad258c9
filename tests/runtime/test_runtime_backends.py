"""Backends behind one protocol, per-session backend state, over the loopback transport."""

from __future__ import annotations

import pytest
import torch

from edgesplit.errors import ConfigError
from edgesplit.hardware import get_device, get_link
from edgesplit.plan import EdgeCloudSetting, PlanningProblem
from edgesplit.plan.planners import Manual
from edgesplit.runtime import PlanProgram
from edgesplit.runtime.backends import BACKENDS, Backend, TorchBackend
from edgesplit.runtime.client import ChainClient
from helpers import server_for


@pytest.fixture(scope="module")
def program() -> PlanProgram:
    from edgesplit.graph import capture

    graph = capture("digits_cnn")
    problem = PlanningProblem("digits_cnn", EdgeCloudSetting(
        edge=get_device("jetson-nano"), cloud=get_device("v100-server"), link=get_link("4g")))
    plan = Manual([graph.layers[1].name]).plan(problem)
    return PlanProgram.load(plan, graph)


class CountingBackend(TorchBackend):
    """Stateful fake: counts each session's requests, as a KV cache would grow per token."""

    name = "counting"

    def new_state(self, step):
        return {"calls": 0}

    def run(self, step, values, state):
        if state is not None:
            state["calls"] += 1
            self.seen.append(state["calls"])
        return super().run(step, values, state)

    def __init__(self) -> None:
        self.seen: list[int] = []


def test_builtin_backends_are_registered_and_follow_the_protocol():
    assert {"torch", "torchscript", "onnxruntime"} <= set(BACKENDS.names())
    for name in ("torch", "torchscript", "onnxruntime"):
        assert isinstance(BACKENDS.get(name)(), Backend)
    with pytest.raises(ConfigError, match="backend"):
        BACKENDS.get("tensorrt")


def test_server_keeps_backend_state_per_session(program):
    backend = CountingBackend()
    program.use_backend(backend)
    try:
        server = server_for(program, "cloud", shape=False)
        channel = server.loopback_channel()
        x = torch.randn(*program.graph.tensors[program.graph.inputs[0]].shape)
        with ChainClient(program, channel, shape=False, session="a") as a, \
                ChainClient(program, channel, shape=False, session="b") as b, \
                ChainClient(program, channel, shape=False) as anonymous:
            want = program.unsplit([x])[0]
            for client in (a, a, b, a, anonymous):
                got, = client.request([x]).outputs
                assert torch.allclose(got, want, atol=1e-5)
        # the client's own step and the server's share the backend: the server's counts are
        # per session (a: 1, 2, 3; b: 1), the anonymous client has none
        assert backend.seen == [1, 2, 1, 3]
    finally:
        program.use_backend(TorchBackend())

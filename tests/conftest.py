"""Shared fixtures: captures of built-in models are slow (seconds), so each is made once.
Fixtures only: the helpers tests import by name are in helpers.py."""

from __future__ import annotations

import os

# Tests start `edgesplit serve` processes from workers whose gRPC is running. With gRPC's fork
# support on, the forked child restarts gRPC's poller before it execs, finds the epoll fd
# closed and aborts ("epoll_wait error: Bad file descriptor", grpc/grpc#43055): a server that
# never starts. Nothing here uses gRPC across a fork, so it is off (read when gRPC loads).
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

import pytest

from edgesplit.graph import LayerGraph, capture
from helpers import captured


@pytest.fixture(scope="session")
def resnet50() -> LayerGraph:
    return captured("resnet50")


@pytest.fixture(scope="session")
def block_graph() -> LayerGraph:
    """The hand-computed inverted-residual block of test_cuts_memory (stem, expand, dw,
    project, add)."""
    import torch

    from dag_models import InvertedResidual

    return capture(InvertedResidual(), torch.randn(1, 3, 8, 8))


@pytest.fixture(scope="session")
def digits_chain():
    """digits_cnn cut after down1.0 (relu_1, 1x32x16x16, crosses) for a Jetson Nano and a V100
    over 4G: the program the serving tests run."""
    from edgesplit.hardware import get_device, get_link
    from edgesplit.plan import EdgeCloudSetting, PlanningProblem
    from edgesplit.plan.planners import Manual
    from edgesplit.runtime import PlanProgram

    problem = PlanningProblem("digits_cnn", EdgeCloudSetting(
        edge=get_device("jetson-nano"), cloud=get_device("v100-server"), link=get_link("4g")))
    return PlanProgram.load(Manual(["down1.0"]).plan(problem))


@pytest.fixture(scope="module")
def one_torch_thread():
    """One intra-op torch thread for a module (``pytestmark =
    pytest.mark.usefixtures("one_torch_thread")``): small convolutions on a two-thread team
    wait for a descheduled partner when the machine is shared (elastify ran 20x slower, a
    0.2 ms partition took 150 ms at load 7 on two cores), which timing-based code (emulation,
    latency tables, switching) cannot tell from the model's own speed."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


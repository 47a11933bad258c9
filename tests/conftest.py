"""Shared fixtures: captures of built-in models are slow (seconds), so each is made once."""

from __future__ import annotations

import functools
import os

# Tests start `edgesplit serve` processes from workers whose gRPC is running. With gRPC's fork
# support on, the forked child restarts gRPC's poller before it execs, finds the epoll fd
# closed and aborts ("epoll_wait error: Bad file descriptor", grpc/grpc#43055): a server that
# never starts. Nothing here uses gRPC across a fork, so it is off (read when gRPC loads).
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

import pytest

from edgesplit.graph import LayerGraph, capture


@functools.cache
def captured(name: str, optimize: bool = True) -> LayerGraph:
    return capture(name, optimize=optimize)


@pytest.fixture(scope="session")
def resnet50() -> LayerGraph:
    return captured("resnet50")


@pytest.fixture(scope="session")
def block_graph() -> LayerGraph:
    """The hand-computed inverted-residual block of test_cuts_memory (stem, expand, dw,
    project, add)."""
    import torch

    from test_cuts_memory import InvertedResidual

    return capture(InvertedResidual(), torch.randn(1, 3, 8, 8))

"""Shared fixtures: captures of built-in models are slow (seconds), so each is made once."""

from __future__ import annotations

import functools

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

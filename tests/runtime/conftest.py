"""Fixtures the runtime's tests share (those of every folder are in tests/conftest.py)."""

from __future__ import annotations

import pytest

from edgesplit.runtime import PlanProgram


@pytest.fixture(scope="module")
def program(digits_chain) -> PlanProgram:
    """The program a module serves unless it defines its own ``program`` (a star, a mesh, a
    slow device): conftest's ``digits_chain``, digits_cnn cut after down1.0 (relu_1,
    1x32x16x16, crosses)."""
    return digits_chain

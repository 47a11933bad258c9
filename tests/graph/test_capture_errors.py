"""A model torch.export cannot capture is refused in one line that points at the user's own
statement (file, line, code) and, for a branch on a tensor's value, says how to rewrite it
(issue 37: only torch's first line, naming torch's internals, was kept)."""

from __future__ import annotations

import inspect

import pytest
import torch
from torch import nn

from edgesplit.errors import CaptureError
from edgesplit.graph import capture


class Branchy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        y = self.lin(x)
        if y.sum() > 0:  # data-dependent control flow
            return y * 2
        return y


def test_a_data_dependent_branch_names_the_users_line_and_torch_cond():
    lines, first = inspect.getsourcelines(Branchy.forward)
    line = first + next(i for i, text in enumerate(lines) if "if y.sum() > 0" in text)
    with pytest.raises(CaptureError) as info:
        capture(Branchy(), example_inputs=torch.randn(1, 4))
    message = str(info.value)
    assert "\n" not in message
    assert f"test_capture_errors.py:{line} in forward: if y.sum() > 0:" in message
    assert "torch.cond" in message

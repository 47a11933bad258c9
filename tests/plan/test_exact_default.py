"""Exact by default: a float model input that crosses the link travels as given unless the
user asks for fewer bits, and the plan table says when one crosses rounded (issue 37: a
two-input model came back 6.7e-4 off with default options, without a word)."""

from __future__ import annotations

import torch
from rich.console import Console
from torch import nn

from edgesplit.hardware import get_device, get_link
from edgesplit.plan import EdgeCloudSetting, PlanningProblem
from edgesplit.plan.planners import Manual
from edgesplit.report.plan_tables import plans_table
from edgesplit.runtime import PlanProgram


class LateInput(nn.Module):
    """Two float inputs; the second is read only after the cut, so it crosses raw."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(8, 16)
        self.b = nn.Linear(6, 16)
        self.head = nn.Linear(16, 3)

    def forward(self, x, y):
        return self.head(torch.relu(self.a(x)) * self.b(y))


def _plan(tmp_path, **setting):
    torch.manual_seed(0)
    x, y = torch.randn(1, 8), torch.randn(1, 6)
    path = tmp_path / "late.pt2"
    torch.export.save(torch.export.export(LateInput().eval(), (x, y)), str(path))
    problem = PlanningProblem(str(path), EdgeCloudSetting(
        edge=get_device("jetson-nano"), cloud=get_device("v100-server"), link=get_link("4g"),
        **setting))
    first = problem.graph.layers[0].name  # the edge computes a(x); y crosses to the cloud
    return problem, Manual([first]).plan(problem), (x, y)


def _caption(problem, plan) -> str:
    console = Console(width=300, record=True)
    console.print(plans_table(problem, {"manual": plan}, "manual"))
    return console.export_text()


def test_a_float_input_crossing_by_default_is_bit_exact(tmp_path):
    problem, plan, inputs = _plan(tmp_path)
    program = PlanProgram.load(plan)
    got, _ = program.run_local(inputs)
    assert torch.equal(got[0], program.unsplit(inputs)[0])
    assert "lossy" not in _caption(problem, plan)


def test_asked_for_8_bits_it_rounds_and_the_table_says_so(tmp_path):
    problem, plan, inputs = _plan(tmp_path, input_bits=8)
    program = PlanProgram.load(plan)
    got, _ = program.run_local(inputs)
    assert not torch.equal(got[0], program.unsplit(inputs)[0])
    text = _caption(problem, plan)
    assert "lossy: the model input crosses at 8 bits in manual" in text

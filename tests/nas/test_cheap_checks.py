"""Options and data that cannot work are refused before any work starts (tables, training,
profiling), in one line naming the flag (issue 37: a JMSNAS budget of 0 used to be refused
after ~140 s, a wrongly shaped data set after ~90 s)."""

from __future__ import annotations

import pytest
import torch
from typer.testing import CliRunner

from edgesplit.cli import app
from edgesplit.data.training import EvalData, LabelledData
from edgesplit.errors import ConfigError
from edgesplit.hardware import get_topology
from edgesplit.nas.jmsnas import resolve_space
from edgesplit.nas.jmsnas import run as jmsnas_run

runner = CliRunner()


@pytest.mark.parametrize("argv, flag", [
    (["nas", "jmsnas", "-t", "jmsnas-chain", "--latency-budget-ms", "0"],
     "--latency-budget-ms"),
    (["nas", "jmsnas", "-t", "jmsnas-chain", "--latency-budget-ms", "-1"],
     "--latency-budget-ms"),
    (["nas", "adaptivenet", "search", "no-such-folder", "--budget", "0"], "--budget"),
    (["nas", "adaptivenet", "search", "no-such-folder", "--budget-ms", "-2"], "--budget-ms"),
])
def test_a_budget_that_cannot_be_met_is_one_line_at_once(argv, flag):
    result = runner.invoke(app, argv)
    assert result.exit_code != 0
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and f"{flag} must be positive" in lines[0], result.output


def test_jmsnas_refuses_data_of_the_wrong_shape_before_any_table(monkeypatch):
    def no_tables(*args, **kwargs):
        raise AssertionError("latency tables built before the data was checked")

    monkeypatch.setattr(jmsnas_run, "latency_tables", no_tables)
    space = resolve_space("digits-mbconv")
    wrong = EvalData("wrong", (torch.zeros(20, 3, 8, 8),), torch.arange(20) % 2)
    data = LabelledData("wrong", wrong, wrong, ("a", "b"))
    with pytest.raises(ConfigError, match="takes"):
        jmsnas_run.run_jmsnas(space, get_topology("jmsnas-chain"), data, budget_ms=1.0)
    with pytest.raises(ConfigError, match="positive"):
        jmsnas_run.run_jmsnas(space, get_topology("jmsnas-chain"), data, budget_ms=0.0)

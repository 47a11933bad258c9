"""One way every NAS system refuses a setting (issue 36 item 5): the class, the setting as the
caller wrote it, and what it must be; a bool is not a count and nan is not a rate."""

from __future__ import annotations

import math

import pytest

from edgesplit.errors import ConfigError, cli_options
from edgesplit.nas.adaptivenet.search import AdaptiveSearch
from edgesplit.nas.adaptivenet.train import ElasticTrainer
from edgesplit.nas.core.checks import is_count, is_fraction, is_number, refuse
from edgesplit.nas.jmsnas.search import JMSNAS
from edgesplit.nas.splitnets.search import SplitNetsSearch
from edgesplit.nas.splitnets.train import SupernetTrainer


def _refusal(make, check):
    with pytest.raises(ConfigError) as info:
        check(make())
    return str(info.value)


@pytest.mark.parametrize(("make", "check", "expected"), [
    (lambda: JMSNAS(latency_budget_ms=1.0, epochs=True), JMSNAS._check,
     "JMSNAS epochs=True must be a whole number >= 1"),
    (lambda: JMSNAS(latency_budget_ms=math.nan), JMSNAS._check,
     "JMSNAS latency_budget_ms=nan must be positive"),
    (lambda: JMSNAS(latency_budget_ms=1.0, arch_fraction=1.5), JMSNAS._check,
     "JMSNAS arch_fraction=1.5 must be between 0 and 1"),
    (lambda: SupernetTrainer(batch_size=0), SupernetTrainer.validate,
     "SupernetTrainer batch_size=0 must be a whole number >= 1"),
    (lambda: SupernetTrainer(sampler="bignas"), SupernetTrainer.validate,
     "SupernetTrainer sampler='bignas' must be one of five, sandwich"),
    (lambda: SplitNetsSearch(None, penalty=-1.0), SplitNetsSearch.validate,
     "SplitNetsSearch penalty=-1.0 must be a number >= 0"),
    (lambda: ElasticTrainer(tune_lr=0.0), ElasticTrainer._check,
     "ElasticTrainer tune_lr=0.0 must be positive"),
    (lambda: AdaptiveSearch(budget=-1.0), lambda s: refuse(s, s._checks()),
     "AdaptiveSearch budget=-1.0 must be a number of seconds > 0"),
])
def test_every_system_refuses_a_setting_in_one_style(make, check, expected):
    assert _refusal(make, check) == expected


def test_under_the_cli_the_setting_is_named_as_a_flag():
    with cli_options():
        message = _refusal(lambda: SupernetTrainer(epochs=0), SupernetTrainer.validate)
    assert message == "SupernetTrainer --epochs 0 must be a whole number >= 1"


def test_the_predicates_refuse_what_a_comparison_lets_through():
    assert not is_count(True) and not is_count(1.0) and is_count(0) and not is_count(0, 1)
    assert not is_number(math.nan) and not is_number(math.inf) and not is_number(False)
    assert not is_number(0.0) and is_number(0.0, strict=False)
    assert is_fraction(0) and is_fraction(1.0) and not is_fraction(1.01)
    assert not is_fraction(-0.1)

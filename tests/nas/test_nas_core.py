"""nas/core: the distinct-architecture sampler, the in-context timer, the latency table type,
the checkpoint layout and the evaluation every system shares, on small stand-ins."""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass
from typing import Any, ClassVar

import pytest
import torch
from torch import nn

from edgesplit.errors import ConfigError
from edgesplit.nas.core.checkpoint import CheckpointFormat
from edgesplit.nas.core.evaluate import recalibrate_bn, top1, top1_accuracy
from edgesplit.nas.core.files import replacing, write_json
from edgesplit.nas.core.sampling import draw_distinct
from edgesplit.nas.core.table import SecondsTable, TableFormatError
from edgesplit.nas.core.timing import BURST, InContextTimer

# -- sampling --------------------------------------------------------------------------------


def test_draws_are_new_bounded_and_share_what_was_seen():
    counter = itertools.count()
    values = [1, 1, 2, 3, 3, 4, 5, 6]
    propose = lambda: values[next(counter) % len(values)]  # noqa: E731
    seen: set = {2}
    assert draw_distinct(propose, 3, proposals=100, seen=seen) == [1, 3, 4]
    assert seen == {1, 2, 3, 4}
    assert draw_distinct(propose, 5, proposals=2, seen=seen) == [5, 6]  # out of proposals
    # admitted or not, a proposal is remembered; patience stops a run of seen ones
    assert draw_distinct(lambda: 7, 2, proposals=50, seen=seen, admit=lambda a: False,
                         patience=3) == []
    assert 7 in seen
    assert draw_distinct(lambda: (8, "x"), 1, proposals=5, seen=seen, key=lambda a: a[0]) == [
        (8, "x")] and 8 in seen


# -- timing ----------------------------------------------------------------------------------


def test_a_burst_keeps_all_passes_but_the_first_and_none_while_warming_up():
    timer = InContextTimer()
    runs = []

    def chain():
        runs.append(timer.call("a", lambda x: x + 1, 1))
        timer.call(("b", 0), lambda: None)

    timer.burst(chain, timed=False)
    assert timer.count("a") == 0 and len(runs) == BURST
    timer.burst(chain, timed=True)
    assert timer.count("a") == timer.count(("b", 0)) == BURST - 1
    assert runs == [2] * 2 * BURST
    assert 0 <= timer.seconds("a") < 1
    timer.call("a", lambda: None)  # outside a burst: not kept
    assert timer.count("a") == BURST - 1


# -- the latency table type ------------------------------------------------------------------


@dataclass(frozen=True)
class _Table(SecondsTable):
    KIND: ClassVar[str] = "test-table"
    VERSION: ClassVar[int] = 2
    WHAT: ClassVar[str] = "test table"
    TITLE: ClassVar[str] = "a test table"
    REBUILD: ClassVar[str] = "measure it again"
    READS: ClassVar[Any] = {1: lambda d: {**d, "entries": {k: v / 1e3 for k, v in
                                                           d["entries_ms"].items()}}}

    entries: dict[str, float]
    fixed: float = 0.0

    def __post_init__(self) -> None:
        for name, value in self.entries.items():
            self.seconds(f"entries[{name!r}]", value)
        self.seconds("fixed", self.fixed, least=None)

    @property
    def fixed_seconds(self) -> float:
        return self.fixed

    def entry_seconds(self, key: str) -> float:
        return self.entries[key]

    def payload(self) -> dict[str, Any]:
        return {"entries": self.entries, "fixed": self.fixed}

    @classmethod
    def from_payload(cls, data):
        return cls(dict(data["entries"]), data.get("fixed", 0.0))


def test_a_table_prices_fixed_plus_entries_and_round_trips(tmp_path):
    table = _Table({"a": 0.25, "b": 0.5}, -0.125)
    assert table.total_seconds(["a", "b", "a"]) == 0.875
    doc = table.to_dict()
    assert list(doc)[:3] == ["kind", "version", "unit"] and doc["unit"] == "seconds"
    assert _Table.read(table.save(tmp_path / "t.json")) == table
    assert not list(tmp_path.glob(".*.tmp"))
    old = {"kind": "test-table", "version": 1, "entries_ms": {"a": 250.0}}
    assert _Table.from_dict(old) == _Table({"a": 0.25})


@pytest.mark.parametrize("doc, message", [
    ({"kind": "other", "version": 2}, "is not a test table; measure it again"),
    ({"kind": "test-table", "version": 7}, "has version 7; this edgesplit reads version 2 "
                                           r"\(and converts version 1\): measure it again"),
    ({"kind": "test-table", "version": 2, "unit": "ms", "entries": {}},
     "unit 'ms' is not 'seconds'"),
    ({"kind": "test-table", "version": 2}, r"malformed \(KeyError"),
    ({"kind": "test-table", "version": 2, "entries": {"a": -1}},
     r"malformed: test table entries\['a'\]=-1 must be >= 0, a finite number of seconds; "
     "measure it again"),
    ({"kind": "test-table", "version": 2, "entries": {}, "fixed": float("nan")},
     "fixed=nan must be a finite number of seconds"),
])
def test_a_table_of_another_kind_version_unit_or_with_bad_entries_is_refused(doc, message):
    with pytest.raises(TableFormatError, match=message):
        _Table.from_dict(doc)
    assert issubclass(TableFormatError, ConfigError)


# -- files and checkpoints -------------------------------------------------------------------


def test_a_failed_write_leaves_the_old_file_and_no_temporary_one(tmp_path):
    path = write_json(tmp_path / "doc.json", {"a": 1})
    with pytest.raises(RuntimeError), replacing(path) as tmp:
        tmp.write_text("half")
        raise RuntimeError("killed")
    assert json.loads(path.read_text()) == {"a": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["doc.json"]


NETWORK = CheckpointFormat("test.network/1", "net.json", "net.safetensors", "test network",
                           "make one", "save it again")


def test_a_checkpoint_round_trips_and_refuses_weights_that_do_not_fit(tmp_path):
    net = nn.Linear(3, 2)
    NETWORK.save(tmp_path, {"size": 3}, net.state_dict())
    assert NETWORK.read(tmp_path) == {"format": "test.network/1", "size": 3}
    state = NETWORK.load_state(tmp_path, nn.Linear(3, 2).state_dict(), fits="size")
    assert torch.equal(state["weight"], net.weight)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["net.json", "net.safetensors"]
    with pytest.raises(ConfigError, match=r"does not match the size in net\.json: bias is "
                                          r"float32\[2\], expected float64\[2\]; weight"):
        NETWORK.load_state(tmp_path, nn.Linear(3, 2).double().state_dict(), fits="size")
    with pytest.raises(ConfigError, match=r"missing extra; save it again"):
        NETWORK.load_state(tmp_path, {**net.state_dict(), "extra": torch.zeros(1)}, fits="x")
    (tmp_path / "net.safetensors").unlink()
    with pytest.raises(ConfigError, match=r"holds net\.json but no weights; save it again"):
        NETWORK.load_state(tmp_path, net.state_dict(), fits="x")
    with pytest.raises(ConfigError, match=r"holds no test network.*make one"):
        NETWORK.read(tmp_path / "nowhere")


# -- evaluation ------------------------------------------------------------------------------


def test_top1_counts_arg_max_hits_in_batches():
    logits = torch.tensor([[0.1, 0.9], [0.8, 0.2], [0.3, 0.7], [0.6, 0.4], [0.0, 1.0]])
    labels = torch.tensor([1, 1, 1, 0, 0])
    assert top1(logits, labels).tolist() == [1.0, 0.0, 1.0, 1.0, 0.0]
    for batch in (1, 2, 5, 8):
        assert top1_accuracy(lambda x: x, logits, labels, batch) == 60.0


def test_recalibration_averages_over_the_batches_and_restores_the_momentum():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3, momentum=0.3))
    net[1].running_mean.fill_(5.0)
    batches = [torch.randn(8, 4) + i for i in range(3)]
    assert recalibrate_bn(net, batches) is net and not net.training
    with torch.no_grad():
        means = torch.stack([net[0](x).mean(0) for x in batches])
    torch.testing.assert_close(net[1].running_mean, means.mean(0))
    assert net[1].momentum == 0.3 and int(net[1].num_batches_tracked) == 3
    seen = []
    recalibrate_bn(net, [1, 2], run=seen.append, norms=[])
    assert seen == [1, 2] and net[1].momentum == 0.3

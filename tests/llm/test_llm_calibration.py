"""``this-machine`` priced from measured block times (llm.planning.calibration), and their
measurement on real stages (llm.stage.calibration). Nothing here depends on how fast this
machine is: planning is checked against tables written by hand, the measurement by the
structure of what it returns and by the cache."""

from __future__ import annotations

import pytest

from edgesplit.errors import ConfigError
from edgesplit.hardware import AnalyticalCompute, Device, Link, chain, estimator_for
from edgesplit.llm import LLMWorkload, Phase, describe_causal_lm, plan_llm
from edgesplit.llm.planning import calibration
from edgesplit.llm.planning.calibration import (
    BlockTimes,
    MeasuredBlocks,
    StaleBlockTimesError,
    code_versions,
    llm_estimator_for,
    load_block_times,
    model_key,
    ops_ms,
    save_block_times,
    stage_threads,
)
from edgesplit.llm.planning.costs import block_ms
from edgesplit.llm.stage import calibration as measuring
from tiny_gguf import write_tiny_gguf

MODEL = "llama_tiny"


@pytest.fixture(autouse=True)
def cache(monkeypatch, tmp_path):
    monkeypatch.setenv("EDGESPLIT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("EDGESPLIT_REMEASURE", raising=False)
    return tmp_path / "cache"


def _device(name: str = "this-machine") -> Device:
    """A stand-in for this machine (its real one would be measured)."""
    return Device(name=name, kind="cpu", compute=AnalyticalCompute(
        peak_gops={32: 50.0}, memory_bandwidth_gb_per_s=10.0))


def _table(lm, **changes) -> BlockTimes:
    """Hand-written times: a decoder block 1 ms + 0.1 ms a prompt token in prefill, 0.5 ms +
    0.01 ms a cached token in decode; the embedding 0.2 ms, the head 3 ms."""
    fields = dict(
        model=model_key(lm), precision=lm.dtype, threads=stage_threads(lm), load=0.2,
        versions=code_versions(),
        prefill={"decoder": ((8, 1.8), (64, 7.4)), "embed": ((8, 0.2),), "head": ((8, 3.0),)},
        decode={"decoder": ((8, 0.58), (128, 1.78)), "embed": ((8, 0.2),),
                "head": ((8, 3.0),)})
    return BlockTimes(**(fields | changes))


def test_a_table_is_read_by_interpolating_and_extrapolating_its_points():
    lm = describe_causal_lm(MODEL)
    table = _table(lm)
    assert table.ms("decoder", Phase.prefill(36)) == pytest.approx(4.6)  # between
    assert table.ms("decoder", Phase.prefill(120)) == pytest.approx(13.0)  # beyond: the slope
    assert table.ms("decoder", Phase.prefill(1)) == pytest.approx(1.1)  # below: the slope
    assert table.ms("decoder", Phase.decode(68)) == pytest.approx(1.18)
    assert table.ms("head", Phase.decode(500)) == 3.0  # one point: constant
    low = _table(lm, decode={**table.decode, "decoder": ((8, 0.1), (9, 5.0))})
    assert low.ms("decoder", Phase.decode(0)) == 0.0  # never below zero


def test_measured_blocks_price_the_model_they_hold_and_hand_on_the_rest():
    lm = describe_causal_lm(MODEL)
    here, roofline = _device(), estimator_for(_device())
    measured = MeasuredBlocks([_table(lm)], roofline)
    decode = Phase.decode(68)
    got = block_ms(lm, here, decode, measured)
    assert got == pytest.approx([0.2] + [1.18] * lm.shape.num_layers + [3.0])
    # another model, another precision: the roofline's sum of kernels
    other = describe_causal_lm(MODEL, dtype="bfloat16")
    assert block_ms(other, here, decode, measured) == ops_ms(other, here, decode, roofline)
    # a single kernel is not a block: the wrapped estimator prices it
    work = next(iter(lm.ops(1, decode)))
    from edgesplit.hardware import LayerWork

    kernel = LayerWork(**vars(work), bits=32)
    assert measured.layer_ms(kernel, here) == roofline.layer_ms(kernel, here)


def test_a_table_of_other_threads_is_not_taken():
    lm = describe_causal_lm(MODEL)
    table = _table(lm, threads=stage_threads(lm) + 1)
    here = _device()
    assert block_ms(lm, here, Phase.decode(8), MeasuredBlocks([table], estimator_for(here))) \
        == ops_ms(lm, here, Phase.decode(8), estimator_for(here))


def test_this_machine_takes_its_cached_table_other_devices_their_roofline(cache):
    lm = describe_causal_lm(MODEL)
    here, elsewhere = _device(), _device("phone")
    assert not isinstance(llm_estimator_for(lm, here), MeasuredBlocks)  # nothing cached yet
    path = save_block_times(_table(lm))
    assert path.parent == cache / "hardware" and load_block_times(lm) == _table(lm)
    assert isinstance(llm_estimator_for(lm, here), MeasuredBlocks)
    assert not isinstance(llm_estimator_for(lm, elsewhere), MeasuredBlocks)
    assert block_ms(lm, here, Phase.decode(68))[1] == pytest.approx(1.18)
    assert block_ms(lm, elsewhere, Phase.decode(68)) == ops_ms(
        lm, elsewhere, Phase.decode(68), estimator_for(elsewhere))


def test_the_planner_prices_this_machine_from_its_table():
    lm = describe_causal_lm(MODEL)
    save_block_times(_table(lm))
    topology = chain("t", [_device(), _device("phone")], [Link(name="l", bandwidth_mbps=100.0,
                                                               rtt_ms=1.0)])
    planning = plan_llm(lm, topology, LLMWorkload(prompt_tokens=36, new_tokens=65))
    decode = planning.costs.decode_ms  # priced at the mean cache length, 36 + 31 = 67
    assert decode[0, 1] == pytest.approx(0.58 + 0.01 * (67 - 8))
    assert decode[1, 1] == pytest.approx(ops_ms(lm, _device("phone"), Phase.decode(67),
                                                estimator_for(_device("phone")))[1])


def test_an_unreadable_or_stale_cache_is_measured_around(cache):
    lm = describe_causal_lm(MODEL)
    path = calibration.block_times_path(model_key(lm), lm.dtype, stage_threads(lm))
    path.parent.mkdir(parents=True)
    path.write_text(_table(lm).model_dump_json())
    assert load_block_times(lm) == _table(lm)  # another process's table, read back
    path.write_text("{not json")
    assert load_block_times(lm) is None
    path.write_text(_table(lm, version=0).model_dump_json())
    assert load_block_times(lm) is None


def test_a_table_saved_here_is_taken_even_when_remeasuring(monkeypatch):
    lm = describe_causal_lm(MODEL)
    monkeypatch.setenv("EDGESPLIT_REMEASURE", "1")
    path = calibration.block_times_path(model_key(lm), lm.dtype, stage_threads(lm))
    path.parent.mkdir(parents=True)
    path.write_text(_table(lm).model_dump_json())
    assert load_block_times(lm) is None  # measured before: measure again
    save_block_times(_table(lm, source="now"))
    assert load_block_times(lm).source == "now"


def test_measuring_returns_every_kind_at_every_point_and_caches_it(monkeypatch):
    lm = describe_causal_lm(MODEL)
    table = measuring.measure_block_times(lm, threads=1, repeats=1)
    assert table.matches(lm, 1)
    for phase, points in (("prefill", measuring.PREFILL_TOKENS),
                          ("decode", measuring.DECODE_CACHED)):
        for kind in ("embed", "decoder", "head"):
            got = getattr(table, phase)[kind]
            room = lm.shape.max_positions - 1 - (measuring.DECODE_STEPS if phase == "decode"
                                                 else 0)
            assert [x for x, _ in got] == sorted({min(p, room) for p in points})
            assert all(ms >= 0 for _, ms in got)
    calls: list[int] = []

    def counted(lm, **kw):
        calls.append(1)
        return _table(lm, threads=kw["threads"])

    monkeypatch.setattr(measuring, "measure_block_times", counted)
    first = measuring.calibrate_this_machine(MODEL, threads=1)
    assert measuring.calibrate_this_machine(MODEL, threads=1) == first and len(calls) == 1
    measuring.calibrate_this_machine(MODEL, threads=1, remeasure=True)
    assert len(calls) == 2


def test_measuring_a_quantized_stage_between_steps_of_other_blocks(tmp_path, monkeypatch):
    """Nineteen decoder blocks (blocks 1-19; 0 is the embedding, 20 the head): the timed
    stages hold blocks 0-16 and 19-20, so blocks 17 and 18 take a decode step before each timed
    step (where a model has no such blocks, a buffer is read)."""
    assert measuring.LONG == 16
    path = write_tiny_gguf(tmp_path / "tiny.gguf", "Q4_0", layers=19)
    lm = describe_causal_lm(path, dtype="gguf")
    made: list[object] = []
    flusher = measuring._flusher
    monkeypatch.setattr(measuring, "_flusher", lambda rest, lm: made.append(rest) or flusher(
        rest, lm))
    table = measuring.measure_block_times(lm, threads=1, repeats=1)
    assert table.precision == "q4_0" and table.matches(lm, 1) and stage_threads(lm) == 1
    assert set(table.decode) == {"embed", "decoder", "head", "step"}
    (rest,) = made
    assert (rest.io.start, rest.io.end) == (17, 19)


def test_one_block_cannot_be_told_from_the_stage(monkeypatch):
    lm = describe_causal_lm(MODEL)
    one = lm.__class__(lm.name, lm.source, lm.shape.__class__(
        **{**vars(lm.shape), "num_layers": 1}), lm.dtype, lm.blocks[:3])
    with pytest.raises(ConfigError, match="at least 2"):
        measuring.measure_block_times(one)


def test_the_cache_is_keyed_by_model_precision_threads_and_activations():
    paths = {calibration.block_times_path(m, p, t, a) for m in ("a", "b")
             for p in ("float32", "q4_0") for t in (1, 2) for a in ("float", "int8", "mixed")}
    assert len(paths) == 24


def test_a_plan_is_priced_from_the_table_of_its_activations(tmp_path):
    """int8 and float activations run other kernels: an int8 plan is not priced from the
    float table, nor the other way round."""
    lm = describe_causal_lm(write_tiny_gguf(tmp_path / "tiny.gguf", "Q4_0"), dtype="gguf")
    here = _device()
    save_block_times(_table(lm, activations="int8"))
    assert load_block_times(lm, activations="float") is None
    assert not isinstance(llm_estimator_for(lm, here), MeasuredBlocks)
    measured = llm_estimator_for(lm, here, "int8")
    assert isinstance(measured, MeasuredBlocks) and measured.table_for(lm) is not None
    topology = chain("t", [here, _device("phone")], [Link(name="l", bandwidth_mbps=100.0,
                                                          rtt_ms=1.0)])
    planning = plan_llm(lm, topology, LLMWorkload(prompt_tokens=36, new_tokens=65,
                                                  activations="int8"))
    assert planning.costs.decode_ms[0, 1] == pytest.approx(0.58 + 0.01 * (67 - 8))
    float_plan = plan_llm(lm, topology, LLMWorkload(prompt_tokens=36, new_tokens=65))
    assert float_plan.costs.decode_ms[0, 1] == pytest.approx(ops_ms(
        lm, here, Phase.decode(67), estimator_for(here))[1])


@pytest.mark.parametrize(("changes", "says"), [
    ({"load": 99.0}, "measured under load 99.0"),
    ({"busy": 1.2}, "other work kept 1.2 cores busy"),
    ({"versions": {**code_versions(), "onnxruntime": "0.0.1"}}, "onnxruntime 0.0.1"),
])
def test_planning_refuses_a_table_measured_under_load_or_by_other_code(changes, says):
    lm = describe_causal_lm(MODEL)
    save_block_times(_table(lm, **changes))
    with pytest.raises(StaleBlockTimesError, match=says) as caught:
        llm_estimator_for(lm, _device())
    assert "--calibrate" in str(caught.value) and "\n" not in str(caught.value)
    assert not isinstance(llm_estimator_for(lm, _device("phone")), MeasuredBlocks)


def test_the_cores_other_work_kept_busy_overrule_the_lagging_load_average():
    """The load average still holds work that ended before the measurement began (a
    benchmark's own stage processes): where the busy cores are known, they decide."""
    lm = describe_causal_lm(MODEL)
    save_block_times(_table(lm, load=99.0, busy=0.1))
    assert isinstance(llm_estimator_for(lm, _device()), MeasuredBlocks)


def test_measuring_records_the_load_and_the_code(monkeypatch):
    """The busy cores are this machine's busy time less this process's own."""
    times = iter([(0.0, 100.0, 5.0), (10.0, 118.0, 14.0)])
    monkeypatch.setattr(measuring, "_cpu_seconds", lambda: next(times))
    table = measuring.measure_block_times(describe_causal_lm(MODEL), threads=1, repeats=1)
    assert table.busy == pytest.approx(0.9) and table.load >= 0
    assert table.versions == code_versions() and table.versions["edgesplit"]


def test_calibrating_measures_over_a_stale_table_and_caches_no_busy_one(monkeypatch):
    lm = describe_causal_lm(MODEL)
    save_block_times(_table(lm, threads=1, load=99.0))
    loads = [0.3, 99.0]
    monkeypatch.setattr(measuring, "measure_block_times", lambda lm, **kw: _table(
        lm, threads=kw["threads"], load=loads.pop(0), source="new"))
    assert measuring.calibrate_this_machine(MODEL, threads=1).source == "new"  # over it
    assert load_block_times(lm, 1).load == 0.3
    with pytest.raises(StaleBlockTimesError, match="busy while measuring"):
        measuring.calibrate_this_machine(MODEL, threads=1, remeasure=True)
    assert load_block_times(lm, 1).load == 0.3  # the busy one was not cached

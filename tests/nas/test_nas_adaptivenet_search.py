"""AdaptiveNet on-device search: the block latency table, NearbyInit/NearbyMutate, the
prefix-tree evaluator and the searches, on the elastified digits_cnn.

No test asserts on a timing: latency tables here are synthetic (fixed seconds per branch), so
bands and budgets are deterministic; the one profiled table is checked for its structure only.
"""

from __future__ import annotations

import itertools
import json
import math
import statistics

import numpy as np
import pytest
import torch

from edgesplit.data.training import load_labelled
from edgesplit.errors import ConfigError, InfeasibleError
from edgesplit.graph import capture
from edgesplit.nas.adaptivenet import ElasticSpace, ElasticSupernet, elastify
from edgesplit.nas.adaptivenet.breed import NearbyBreeder, UniformBreeder
from edgesplit.nas.adaptivenet.data import cosine, top1
from edgesplit.nas.adaptivenet.evaluate import PrefixTree, PrefixTreeEvaluator, measure_reuse
from edgesplit.nas.adaptivenet.latency import BlockLatencyTable, measure_subnet, table_error
from edgesplit.nas.adaptivenet.pool import SubnetPool
from edgesplit.nas.adaptivenet.search import AdaptiveSearch, AnnealingSearch, EvolutionBaseline
from edgesplit.nas.core.evolution import Breeder


@pytest.fixture(scope="module")
def supernet() -> ElasticSupernet:
    return elastify(capture("digits_cnn"))


@pytest.fixture(scope="module")
def space(supernet: ElasticSupernet) -> ElasticSpace:
    return supernet.space


@pytest.fixture(scope="module")
def batches() -> list:
    """120 held-out digits in three batches of 40."""
    test = load_labelled("digits").test
    assert test.labels is not None
    x, y = test.inputs[0][:120], test.labels[:120]
    return [((x[i:i + 40],), y[i:i + 40]) for i in range(0, 120, 40)]


@pytest.fixture(scope="module")
def table(space: ElasticSpace) -> BlockLatencyTable:
    """Synthetic seconds: an original block 1 ms (the first ones dearer, as at high
    resolution), a merged block what its donor costs, a shrunk one its kept fraction."""
    def cost(start: int) -> float:
        return 1e-3 * (space.num_blocks - start)

    seconds = {}
    for b in space.branches:
        if b.kind == "merged":
            seconds[b.name] = cost(b.donor)
        else:
            seconds[b.name] = cost(b.start) * b.keep
    return BlockLatencyTable(space, seconds, 1e-4, 40, "digits_cnn")


def all_archs(space: ElasticSpace) -> list[tuple[str, ...]]:
    found = []

    def walk(position: int, path: tuple[str, ...]) -> None:
        if position == space.num_blocks:
            found.append(path)
            return
        for b in space.starting_at[position]:
            walk(b.end, (*path, b.name))

    walk(0, ())
    return found


# -- the latency table ---------------------------------------------------------------------


def test_predict_is_side_plus_sum_of_entries(space, table):
    rng = np.random.default_rng(0)
    for _ in range(20):
        arch = space.random_arch(rng)
        expected = table.side_seconds + sum(table.branch_seconds[n] for n in arch)
        assert table.predict(arch) == pytest.approx(expected, rel=1e-12)
    with pytest.raises(ConfigError, match="stops at block"):
        table.predict(space.original[:-1])


def test_min_and_max_latency_are_the_extremes_over_all_paths(space, table):
    archs = all_archs(space)
    assert len(archs) == space.count()
    latencies = [table.predict(a) for a in archs]
    fastest, low = table.fastest()
    slowest, high = table.slowest()
    assert low == pytest.approx(min(latencies)) and table.min_latency == low
    assert high == pytest.approx(max(latencies)) and table.max_latency == high
    assert table.predict(fastest) == low and table.predict(slowest) == high


def test_table_json_round_trip(table, tmp_path, supernet):
    again = BlockLatencyTable.from_dict(json.loads(json.dumps(table.to_dict())))
    assert again == table
    path = table.save(tmp_path / "table.json")
    loaded = BlockLatencyTable.load(path, supernet=supernet)
    assert loaded == table
    assert loaded.predict(supernet.space.original) == table.predict(supernet.space.original)


@pytest.mark.parametrize("damage, message", [
    (lambda d: d.update(kind="something-else"), "not an AdaptiveNet block latency table"),
    (lambda d: d.update(version=99), "version 99"),
    (lambda d: d["branch_seconds"].pop("b0"), "missing branches"),
    (lambda d: d["branch_seconds"].update(b0=-1.0), "finite number of seconds"),
    (lambda d: d["branch_seconds"].update(b0="fast"), "finite number of seconds"),
    (lambda d: d.pop("side_seconds"), "malformed"),
    (lambda d: d.update(space_fingerprint="0" * 64), "space_fingerprint"),
    (lambda d: d.update(batch=0), "batch"),
])
def test_malformed_tables_are_refused_with_advice(table, tmp_path, damage, message):
    data = json.loads(json.dumps(table.to_dict()))
    damage(data)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ConfigError, match=message) as info:
        BlockLatencyTable.load(path)
    assert "profile" in str(info.value)  # says how to get a good table


def test_unreadable_and_foreign_tables_are_refused(table, tmp_path, space):
    path = tmp_path / "broken.json"
    path.write_text("{not json")
    with pytest.raises(ConfigError, match="cannot read block latency table"):
        BlockLatencyTable.load(path)
    other = ElasticSpace(space.num_blocks, tuple(b for b in space.branches if b.level >= 0))
    with pytest.raises(ConfigError, match="another supernet"):
        table.check(other)


def test_profile_measures_every_branch(supernet, batches):
    inputs = batches[0][0]
    calls = []
    profiled = BlockLatencyTable.profile(supernet, inputs, repeats=2, warmup=0,
                                         progress=lambda *a: calls.append(a))
    assert set(profiled.branch_seconds) == set(supernet.space.by_name)
    assert all(math.isfinite(s) and s >= 0 for s in profiled.branch_seconds.values())
    assert profiled.batch == 40 and profiled.model == "digits_cnn"
    assert profiled.measurement["threads"] == torch.get_num_threads()
    assert calls[-1] == ("timing branches in context", 2, 2)
    assert measure_subnet(supernet, supernet.space.original, inputs, repeats=2, warmup=0) >= 0
    report = table_error(profiled, supernet, inputs, samples=3, repeats=2, warmup=0)
    assert report["samples"] == 3 and report["archs"][0]["arch"] == list(supernet.space.original)
    with pytest.raises(ConfigError, match="batch size 40"):
        table_error(profiled, supernet, (inputs[0][:2],), samples=1)


# -- breeding ------------------------------------------------------------------------------


def band_breeder(space, table) -> NearbyBreeder:
    low, high = table.min_latency, table.max_latency
    return NearbyBreeder(space, table, budget=low + 0.4 * (high - low),
                         delta=0.05 * (high - low))


def test_breeders_implement_the_protocol(space, table):
    assert isinstance(UniformBreeder(space), Breeder)
    assert isinstance(band_breeder(space, table), Breeder)


def test_nearby_init_lands_in_the_band(space, table):
    breeder = band_breeder(space, table)
    rng = np.random.default_rng(0)
    archs = [breeder.random_arch(rng) for _ in range(100)]
    low, high = breeder.band
    assert all(low <= table.predict(space.check(a)) <= high for a in archs)
    assert len(set(archs)) > 1  # random, not one answer
    # the band is a real restriction: uniform sampling leaves it
    uniform = [space.random_arch(rng) for _ in range(100)]
    assert not all(breeder.in_band(a) for a in uniform)


def test_nearby_init_returns_the_closest_when_the_band_is_empty(space, table):
    breeder = NearbyBreeder(space, table, budget=table.max_latency * 3, delta=1e-6,
                            max_attempts=20)
    arch = breeder.random_arch(np.random.default_rng(0))
    assert space.check(arch) == arch
    assert breeder.distance(arch) > 0


def one_span_changes(space: ElasticSpace, parent: tuple[str, ...]) -> list[tuple[str, ...]]:
    """Every other subnet that differs from ``parent`` over one run of blocks at most as wide
    as the widest branch (what one mutation and its repair can reach)."""
    width = max(b.end - b.start for b in space.branches)
    found = []
    for arch in all_archs(space):
        if arch == parent:
            continue
        head = next(k for k in range(len(parent) + 1)
                    if k == len(parent) or k == len(arch) or arch[k] != parent[k])
        tail = next(k for k in range(len(parent) + 1)
                    if k == len(parent) - head or k == len(arch) - head
                    or arch[-1 - k] != parent[-1 - k])
        start = space.by_name[parent[head]].start
        end = space.by_name[parent[len(parent) - tail - 1]].end
        if end - start <= width:
            found.append(arch)
    return found


def test_nearby_mutate_stays_in_the_band_when_it_can(space, table):
    breeder = band_breeder(space, table)
    uniform = UniformBreeder(space)
    rng = np.random.default_rng(1)
    parents = [breeder.random_arch(rng) for _ in range(30)]
    left_band = stayed = 0
    for parent in parents:
        reachable = [a for a in one_span_changes(space, parent) if breeder.in_band(a)]
        for _ in range(5):
            child = breeder.mutate_arch(parent, rng, 0.0)
            assert space.check(child) == child and child != parent
            assert breeder.in_band(child) or not reachable
            stayed += breeder.in_band(child)
            left_band += not breeder.in_band(uniform.mutate_arch(parent, rng, 0.0))
    assert stayed > 0.8 * 5 * len(parents)
    assert left_band > 0  # without the repair, mutations do leave the band


def test_crossover_splices_two_parents(space, table):
    breeder = band_breeder(space, table)
    rng = np.random.default_rng(2)
    first, second = ("b0", "b1+2", "b4", "b5"), ("b0-1", "b1", "b2", "b3-2", "b4", "b5")
    splices = {(*a[:i], *b[j:]) for a, b in ((first, second), (second, first))
               for i in range(len(a) + 1) for j in range(len(b) + 1)}
    for _ in range(10):
        child = UniformBreeder(space).crossover_arch(first, second, rng)
        assert space.check(child) == child and child not in (first, second)
        assert child in splices
    child = breeder.crossover_arch(first, second, rng)
    assert space.check(child) == child


# -- the prefix tree -----------------------------------------------------------------------


def test_prefix_tree_caches_shared_prefixes_where_they_diverge():
    archs = [("a", "b", "c"), ("a", "b", "d"), ("a", "e", "f"), ("g", "h", "i")]
    tree = PrefixTree.build(archs)
    assert tree.cached == (("a",), ("a", "b"))  # ("g",) is nobody else's prefix
    assert tree.depth == 2
    assert tree.branch_calls() == 1 + 1 + 1 + 1 + 2 + 3  # a, b, c, d, e-f, g-h-i
    assert tree.importance[("a",)] == 1 * 3 and tree.importance[("a", "b")] == 2 * 2
    shallow = PrefixTree.build(archs, max_depth=1)
    assert shallow.cached == (("a", "b"),)  # the more important of a's two prefixes
    assert PrefixTree.build(archs, max_depth=0).cached == ()


def test_cache_hits_are_identical_to_recomputation(supernet, batches, space):
    archs = all_archs(space)
    outputs: dict = {}
    reuse = PrefixTreeEvaluator(supernet, batches, top1)
    scratch = PrefixTreeEvaluator(supernet, batches, top1, reuse=False)
    with_tree = reuse.evaluate(archs, on_output=lambda a, i, out: outputs.__setitem__((a, i),
                                                                                       out))
    seen = set()

    def check(arch, index, out):
        assert torch.equal(out, outputs[(arch, index)])
        seen.add((arch, index))

    from_scratch = scratch.evaluate(archs, on_output=check)
    assert seen == set(outputs) and len(seen) == len(archs) * len(batches)
    assert with_tree == from_scratch  # exactly equal accuracies
    assert reuse.last_stats.cached_features > 0  # the cache was used
    assert all(0.0 <= acc <= 1.0 for acc in with_tree.values())
    assert with_tree[space.original] > 0.9  # the pretrained digits_cnn


def test_reuse_executes_fewer_branch_calls(supernet, batches, space, table):
    rng = np.random.default_rng(3)
    shared = ("b0", "b1")
    archs = list(dict.fromkeys(a for a in (space.random_arch(rng) for _ in range(200))
                               if a[:2] == shared))
    assert len(archs) >= 4
    result = measure_reuse(supernet, batches, top1, archs, table=table)
    assert result["identical"]
    base, reuse = result["baseline"], result["reuse"]
    assert reuse["branch_calls"] < base["branch_calls"]
    assert base["branch_calls"] == len(batches) * sum(len(a) for a in archs)
    tree = PrefixTree.build(archs)
    assert reuse["branch_calls"] == len(batches) * tree.branch_calls()
    assert base["side_calls"] == len(archs) * len(batches) and reuse["side_calls"] == len(batches)
    assert result["call_saving_pct"] > 0 and result["predicted_saving_pct"] > 0
    # wall time: the median of 5 runs of each, caches fresh every run (issue 38)
    assert result["repeats"] == 5
    assert all(len(runs) == 5 for runs in result["seconds"].values())
    assert result["median_seconds"]["reuse"] == statistics.median(result["seconds"]["reuse"])
    with pytest.raises(ConfigError, match="repeats"):
        measure_reuse(supernet, batches, top1, archs, repeats=0)


@pytest.mark.parametrize("max_depth", [0, 1, 2])
def test_cached_features_never_exceed_max_depth(supernet, batches, space, table, max_depth):
    archs = all_archs(space)
    evaluator = PrefixTreeEvaluator(supernet, batches, top1, max_depth=max_depth, table=table)
    accuracy = evaluator.evaluate(archs)
    assert evaluator.last_stats.peak_cached <= max_depth
    assert evaluator.last_tree is not None and evaluator.last_tree.depth <= max_depth
    unbounded = PrefixTreeEvaluator(supernet, batches, top1).evaluate(archs)
    assert accuracy == unbounded
    if max_depth == 0:
        assert evaluator.last_stats.branch_calls == len(batches) * sum(len(a) for a in archs)


def test_cosine_against_the_teachers_outputs(supernet, batches, space):
    with torch.no_grad():
        teacher = [(inputs, supernet(*inputs)) for inputs, _ in batches]
    evaluator = PrefixTreeEvaluator(supernet, teacher, cosine)
    rng = np.random.default_rng(4)
    scores = evaluator.evaluate([space.original, space.random_arch(rng)])
    assert scores[space.original] == pytest.approx(1.0, abs=1e-5)
    assert all(-1.0 <= s <= 1.0 + 1e-6 for s in scores.values())


def test_evaluator_refuses_bad_settings(supernet, batches):
    with pytest.raises(ConfigError, match="max_depth"):
        PrefixTreeEvaluator(supernet, batches, top1, max_depth=-1)
    with pytest.raises(ConfigError, match="at least one batch"):
        PrefixTreeEvaluator(supernet, [], top1)
    bad = PrefixTreeEvaluator(supernet, batches, lambda out, y: out.sum())
    with pytest.raises(ConfigError, match="one score per sample"):
        bad.evaluate([supernet.space.original])
    with pytest.raises(ConfigError, match="unknown branch"):
        PrefixTreeEvaluator(supernet, batches, top1).evaluate([("nope",)])


# -- the searches --------------------------------------------------------------------------


def middle_budget(table) -> float:
    return table.min_latency + 0.4 * (table.max_latency - table.min_latency)


def test_adaptive_search_finds_a_subnet_within_budget(supernet, batches, table):
    budget = middle_budget(table)
    steps = []
    evaluator = PrefixTreeEvaluator(supernet, batches, top1, max_depth=3, table=table)
    search = AdaptiveSearch(budget, population=8, iterations=4, seed=0,
                            progress=lambda i, n, best: steps.append((i, n)))
    assert search.fit(evaluator, table) is search
    assert search.best_latency_ <= budget
    assert table.predict(search.best_arch_) == search.best_latency_
    assert search.best_accuracy_ == max(c.score for c in search.history_
                                        if c.metrics["latency"] <= budget)
    _, high = search.breeder_.band
    assert all(c.metrics["latency"] <= high for c in search.history_)
    assert len({c.arch for c in search.history_}) == len(search.history_)  # each once
    assert steps == [(i, 4) for i in range(5)] and len(search.curve_) == 5
    evaluated = [s.evaluated for s in search.curve_]
    best = [s.best_accuracy for s in search.curve_]
    assert evaluated == sorted(evaluated) and evaluated[-1] == len(search.history_)
    assert best == sorted(best) and best[-1] == search.best_accuracy_
    reached = search.evaluations_to(search.best_accuracy_)
    assert reached is not None and 1 <= reached <= len(search.history_)
    assert search.evaluations_to(2.0) is None
    # wall seconds (Fig. 12): rising, at least the evaluation seconds, read off the curve
    wall = [s.wall_s for s in search.curve_]
    assert wall == sorted(wall) and all(s.wall_s >= s.seconds for s in search.curve_)
    first = next(s for s in search.curve_ if s.best_accuracy == search.best_accuracy_)
    assert search.seconds_to(search.best_accuracy_) == first.wall_s
    assert search.seconds_to(2.0) is None
    assert search.pareto_ and all(c in search.history_ for c in search.pareto_)
    # reproducible
    again = AdaptiveSearch(budget, population=8, iterations=4, seed=0).fit(evaluator, table)
    assert [c.arch for c in again.history_] == [c.arch for c in search.history_]
    # the history feeds the subnet pool of section 5.3
    pool = SubnetPool.build(search.evaluated(), budget, search.delta_,
                            space=supernet.space)
    assert pool.entries and max(e.accuracy for e in pool.entries
                                if e.latency_s <= budget) == search.best_accuracy_


def test_an_impossible_budget_is_infeasible(supernet, batches, table):
    evaluator = PrefixTreeEvaluator(supernet, batches, top1)
    budget = table.min_latency * 0.5
    for search in (AdaptiveSearch(budget), EvolutionBaseline(budget), AnnealingSearch(budget)):
        with pytest.raises(InfeasibleError, match="the fastest") as info:
            search.fit(evaluator, table)
        assert f"{table.min_latency * 1e3:.4g} ms" in str(info.value)
    assert evaluator.stats.subnets == 0  # nothing was evaluated


def test_baselines_run_with_the_same_history_format(supernet, batches, table):
    budget = middle_budget(table)
    evaluator = PrefixTreeEvaluator(supernet, batches, top1, table=table)
    evolution = EvolutionBaseline(budget, population=8, iterations=3).fit(evaluator, table)
    annealing = AnnealingSearch(budget, steps=12).fit(evaluator, table)
    for search in (evolution, annealing):
        assert search.best_latency_ <= budget
        # over-budget subnets are discarded after prediction, never evaluated
        assert all(c.metrics["latency"] <= budget for c in search.history_)
        assert set(search.history_[0].metrics) == {"accuracy", "latency"}
        assert search.curve_[-1].evaluated == len(search.history_)
    assert len(annealing.curve_) == 13
    assert len({c.arch for c in annealing.history_}) == len(annealing.history_)


def test_a_budget_above_every_subnet_still_searches(supernet, batches, table):
    evaluator = PrefixTreeEvaluator(supernet, batches, top1, table=table)
    search = AdaptiveSearch(table.max_latency * 2, population=4, iterations=1,
                            max_attempts=5).fit(evaluator, table)
    assert search.best_latency_ <= table.max_latency * 2


@pytest.mark.parametrize("kwargs, name", [
    ({"population": 0}, "population"),
    ({"iterations": -1}, "iterations"),
    ({"delta": -1.0}, "delta"),
    ({"crossover_fraction": 1.5}, "crossover_fraction"),
])
def test_search_parameters_are_checked(supernet, batches, table, kwargs, name):
    evaluator = PrefixTreeEvaluator(supernet, batches, top1)
    with pytest.raises(ConfigError, match=name):
        AdaptiveSearch(middle_budget(table), **kwargs).fit(evaluator, table)
    with pytest.raises(ConfigError, match="budget"):
        AdaptiveSearch(-1.0).fit(evaluator, table)
    with pytest.raises(ConfigError, match="t_end"):
        AnnealingSearch(1.0, t_start=0.01, t_end=0.1).fit(evaluator, table)


def test_all_paths_helper_matches_space_count(space):
    assert len(set(all_archs(space))) == space.count()
    assert all(space.check(a) == a for a in itertools.islice(all_archs(space), 10))

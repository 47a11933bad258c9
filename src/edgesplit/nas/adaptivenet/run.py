"""AdaptiveNet's stages as the CLI and the benchmark run them.

- ``elastify_model(model, ...)``: on the cloud, elastify a pretrained model, train the added
  branches (distillation, then tuning) and save the supernet with how it was trained (the data
  spec and task, so the device searches on the same kind of data);
- ``search_device(folder, ...)``: on the device, profile the block latency table (or, with an
  edge-cloud setting, price every subnet at its best split), search under the budget with the
  prefix-tree evaluator, keep the pool, and write the best subnet as ``model.pt2`` + ``plan.json``;
- ``serve_pool(folder, ...)``: serve requests with the pool's best subnet, switching when the
  measured latency drifts (a background load or an injected slowdown from a given request on).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from edgesplit.errors import ConfigError, EdgesplitError, InfeasibleError, option
from edgesplit.nas.adaptivenet.checkpoint import build_supernet, load_supernet, save_supernet
from edgesplit.nas.adaptivenet.data import SCORES, ElasticData, batches, load_elastic_data
from edgesplit.nas.adaptivenet.elastify import ElasticConfig
from edgesplit.nas.adaptivenet.evaluate import PrefixTreeEvaluator
from edgesplit.nas.adaptivenet.latency import BlockLatencyTable, far_from_estimate
from edgesplit.nas.adaptivenet.loads import CpuLoad, Slowdown
from edgesplit.nas.adaptivenet.monitor import (
    CONFIRM,
    COOLDOWN_REQUESTS,
    COOLDOWN_S,
    TOLERANCE,
    LatencyMonitor,
    count_flaps,
)
from edgesplit.nas.adaptivenet.placement import JointLatency, plan_subnet
from edgesplit.nas.adaptivenet.pool import SubnetPool
from edgesplit.nas.adaptivenet.runner import AdaptiveRunner
from edgesplit.nas.adaptivenet.search import AdaptiveSearch
from edgesplit.nas.adaptivenet.space import SubnetArch
from edgesplit.nas.adaptivenet.supernet import ElasticSupernet
from edgesplit.nas.adaptivenet.train import (
    ElasticTrainer,
    latency_range_accuracy,
    relative_macs,
    subnet_accuracy,
)
from edgesplit.nas.core.files import read_document, write_json
from edgesplit.plan.cost import EdgeCloudSetting
from edgesplit.units import at_least

__all__ = ["DEFAULT_DATA", "SearchRun", "budget_note", "calibration_scale", "data_for",
           "elastify_model", "search_device", "serve_pool", "supernet_data", "trained_data"]

Progress = Callable[[str, int, int], None]

# What the built-in models made for a packaged data set train on when --data is not given.
DEFAULT_DATA = {"all_minilm_l6_v2": "sentences", "minilm": "sentences", "digits_cnn": "digits"}


def data_for(model: str, data: str | None) -> str:
    """The data spec for ``model``: the user's, else the built-in model's own set. Any other
    model needs ``data``: a user's model trained on digits (and its task switched to cosine
    to fit) would look plausible and be wrong."""
    if data:
        return data
    if model in DEFAULT_DATA:
        return DEFAULT_DATA[model]
    raise ConfigError(f"{model} has no training data of its own: give "
                      f"{option('data', 'DATA')} (its labelled data: a folder of class "
                      "sub-folders of images or an .npz/.pt of inputs and labels; or digits / "
                      "sentences where the model takes them)")


def supernet_data(supernet: ElasticSupernet, spec: str, task: str | None = None,
                  seed: int = 0, *, train_limit: int | None = None,
                  search_size: int | None = None) -> ElasticData:
    """``spec`` loaded for ``supernet``'s inputs, targets from its pretrained path."""
    shape = [int(s) for s in supernet.meta["blocks"][0]["in_shape"]]
    return load_elastic_data(spec, input_shape=shape, teacher=supernet, task=task, seed=seed,
                             train_limit=train_limit, search_size=search_size)


def trained_data(supernet: ElasticSupernet) -> ElasticData:
    """The data a saved supernet was trained on, divided as it was (with the training's
    seed): the device searches on the same kind of data, never on what trained it, and the
    test part stays apart from both."""
    training = supernet.meta.get("training") or {}
    return supernet_data(supernet, training.get("data", "digits"), training.get("task"),
                         training.get("seed", 0),
                         train_limit=training.get("train_limit"),
                         search_size=training.get("search_size"))


def _summary(supernet: ElasticSupernet) -> dict[str, Any]:
    space = supernet.space
    kinds = {k: sum(1 for b in space.branches if b.kind == k)
             for k in ("original", "merged", "shrunk")}
    return {"model": supernet.meta["model"], "blocks": space.num_blocks,
            "branches": kinds, "subnets": space.count(),
            "params": supernet.meta["total_params"],
            "added_params": sum(p.numel() for p in supernet.added_parameters())}


def elastify_model(model: str, *, input_shape: Sequence[int] | None = None,
                   config: ElasticConfig | None = None, data: str | None = None,
                   task: str | None = None, trainer: ElasticTrainer | None = None,
                   out: str | Path | None = None, progress: Progress | None = None,
                   seed: int = 0, train_limit: int | None = None,
                   search_size: int | None = None) -> tuple[ElasticSupernet, dict[str, Any]]:
    """Elastify ``model``, train it on ``data`` and save it to ``out``; returns the supernet
    and a summary (blocks, branches, training, latency-range accuracy before and after).
    ``train_limit`` and ``search_size`` bound the train and search parts
    (:func:`~.data.load_elastic_data`); the search reads the same parts back."""
    trainer = trainer or ElasticTrainer(seed=seed)
    started = time.perf_counter()
    supernet = build_supernet(model, input_shape=input_shape, config=config)
    spec = data_for(model, data)
    loaded = supernet_data(supernet, spec, task, seed, train_limit=train_limit,
                           search_size=search_size)
    before = latency_range_accuracy(supernet, loaded, seed=seed)
    if progress is not None:
        trainer.progress = lambda phase, step, steps, loss: progress(phase, step, steps)
    trainer.fit(supernet, loaded)
    after = latency_range_accuracy(supernet, loaded, seed=seed)
    training = {
        "data": spec, "task": loaded.task, "score": SCORES[loaded.task], "seed": seed,
        "sizes": loaded.sizes(),
        "train_limit": train_limit, "search_size": search_size,
        "distill_epochs": trainer.distill_epochs, "tune_epochs": trainer.tune_epochs,
        "batch_size": trainer.batch_size, "lr": trainer.lr, "tune_lr": trainer.tune_lr,
        "history": [vars(r) for r in trainer.history_],
        "indicator_before": before, "indicator_after": after,
        "seconds": time.perf_counter() - started,
    }
    if out is not None:
        save_supernet(out, supernet, training)
    supernet.meta["training"] = training
    return supernet, {**_summary(supernet), "config": supernet.meta["config"],
                      "training": training}


# ---- on the device: search ------------------------------------------------------------------

SEARCH_FILE = "search.json"
POOL_FILE = "pool.json"
TABLE_FILE = "latency.json"
MODEL_FILE = "model.pt2"
PLAN_FILE = "plan.json"


@dataclass(frozen=True)
class SearchRun:
    """What ``search_device`` found: the search, the pool, the latency model and a summary."""

    search: AdaptiveSearch
    pool: SubnetPool
    table: BlockLatencyTable
    summary: dict[str, Any]


def _latency_model(supernet: ElasticSupernet, example: tuple[torch.Tensor, ...],
                   setting: EdgeCloudSetting | None, repeats: int,
                   progress: Progress | None) -> tuple[BlockLatencyTable, JointLatency | None]:
    if setting is None:
        return BlockLatencyTable.profile(supernet, example, repeats=repeats,
                                         progress=progress), None
    joint = JointLatency(supernet, setting, example)
    return joint.table(), joint


def _table_check(supernet: ElasticSupernet, table: BlockLatencyTable,
                 example: tuple[torch.Tensor, ...]) -> str | None:
    """A warning when the measured table is far off the roofline of this machine (the
    ``this-machine`` device a local search's plan is priced on) for the pretrained path."""
    from edgesplit.graph import capture
    from edgesplit.hardware.catalog import resolve_device
    from edgesplit.hardware.estimators import estimator_for

    device = resolve_device("this-machine")
    original = supernet.space.original
    try:
        graph = capture(supernet.subnet(original), example, name="pretrained path")
    except EdgesplitError:  # an advisory check: what cannot be captured is not checked
        return None
    layer_ms = estimator_for(device).graph_ms(graph, device)
    estimate_s = dict.fromkeys(original, 0.0)
    side_s = 0.0
    for layer in graph.layers:  # a Subnet's layers sit under blocks.<i> or side
        parts = layer.module_path.split(".")
        if parts[0] == "blocks" and len(parts) > 1 and parts[1].isdigit():
            estimate_s[original[int(parts[1])]] += layer_ms[layer.name] / 1e3
        else:
            side_s += layer_ms[layer.name] / 1e3
    return far_from_estimate(table, estimate_s, side_s=side_s,
                             estimate=f"{device.name} roofline estimate")


def _budget(table: BlockLatencyTable, original: SubnetArch, budget: float | None,
            budget_ms: float | None) -> float:
    if budget_ms is not None:
        if budget_ms <= 0:
            raise ConfigError(f"{option('budget_ms', budget_ms)} must be positive")
        return budget_ms / 1000
    fraction = 0.6 if budget is None else budget
    if not 0 < fraction <= 2:
        raise ConfigError(f"{option('budget', fraction)} is a fraction of the pretrained "
                          "model's latency, e.g. 0.6")
    return fraction * table.predict(original)


def _check_fits(table: BlockLatencyTable, original: SubnetArch, budget_s: float) -> None:
    fastest, seconds = table.fastest()
    if seconds > budget_s:
        least = seconds / table.predict(original)
        raise InfeasibleError(
            f"no subnet fits the budget of {budget_s * 1e3:.4g} ms: the fastest, "
            f"{'-'.join(fastest)}, takes {seconds * 1e3:.4g} ms (predicted); give "
            f"{option('budget_ms')} {at_least(seconds * 1e3)} or more, or {option('budget')} "
            f"{at_least(least, 3)} or more (a fraction of the pretrained model's latency)")


def _plan_setting(setting: EdgeCloudSetting | None) -> EdgeCloudSetting:
    """A local search's plan: everything on this machine (the edge of a nominal setting)."""
    if setting is not None:
        return setting
    from edgesplit.hardware.catalog import resolve_device, resolve_link

    return EdgeCloudSetting(edge=resolve_device("this-machine"),
                            cloud=resolve_device("v100-server"), link=resolve_link("wifi"))


SERVED_INPUTS = 1000  # the test inputs serving cycles through
WARM_UP = 10  # requests on a fresh serving thread before anything is timed
CALIBRATION_ROUNDS = 3  # turns each pool subnet takes when serving calibrates the pool
POOL_LEVELS = (0.7, 0.5, 0.35)  # extra budgets (fractions of the budget) the pool covers


def search_device(folder: str | Path, *, budget: float | None = None,
                  budget_ms: float | None = None, delta: float = 0.1,
                  setting: EdgeCloudSetting | None = None, population: int = 20,
                  iterations: int = 10, max_depth: int | None = 4, reuse: bool = True,
                  batch: int = 1, repeats: int = 20, eval_batch_size: int = 100,
                  pool_levels: Sequence[float] = POOL_LEVELS, seed: int = 0,
                  out: str | Path | None = None, progress: Progress | None = None
                  ) -> SearchRun:
    """Search the supernet in ``folder`` on this device (see the module docstring).

    ``budget`` is a fraction of the pretrained model's predicted latency (default 0.6, the
    paper's 60 %); ``budget_ms`` an absolute budget instead; ``delta`` the band half-width as
    a fraction of the budget; ``batch`` the batch size latency is measured at. The pool the
    runtime switches within is the accuracy-latency front of this search and of shorter ones
    at ``pool_levels`` times the budget, so a load that slows the device 3x still finds a
    subnet in it (the paper searches again in that case).
    """
    supernet, _ = load_supernet(folder)
    data = trained_data(supernet)
    example = data.search.example(batch)
    table, joint = _latency_model(supernet, example, setting, repeats, progress)
    # a joint search prices branches with the cost model itself: only a measured table is checked
    warning = _table_check(supernet, table, example) if joint is None else None
    budget_s = _budget(table, supernet.space.original, budget, budget_ms)
    _check_fits(table, supernet.space.original, budget_s)
    evaluator = PrefixTreeEvaluator(supernet, batches(data.search, eval_batch_size),
                                    data.metric, max_depth=max_depth, reuse=reuse, table=table)
    started = time.perf_counter()
    step = (lambda i, n, best: progress("iteration", i, n)) if progress else None
    search = AdaptiveSearch(budget_s, delta=delta * budget_s, population=population,
                            iterations=iterations, seed=seed, progress=step)
    search.fit(evaluator, table)
    seconds = time.perf_counter() - started
    levels = _pool_searches(evaluator, table, budget_s, delta, pool_levels, population,
                            max(1, iterations // 2), seed)
    candidates = [*search.evaluated(), *(c for lv in levels for c in lv.evaluated())]
    pool = SubnetPool.build(candidates, budget_s, None, space=supernet.space,
                            meta={"model": supernet.meta["model"]})
    # what is deployed is the pool's optimum: the most accurate subnet within the budget of
    # every search (a smaller-budget search may find one the main search missed)
    summary = _search_summary(supernet, data, search, pool, table, joint, budget_s, seconds,
                              evaluator)
    summary["pool"] = [e.to_dict() for e in pool]
    summary["warnings"] = [warning] if warning else []
    summary["pool_levels"] = [{"level": lv.budget / budget_s, "budget_ms": lv.budget * 1000,
                               "evaluated": len(lv.history_),
                               "best_accuracy": lv.best_accuracy_,
                               "best_latency_ms": lv.best_latency_ * 1000} for lv in levels]
    if out is not None:
        _save_search(Path(out), folder, supernet, pool, table, joint, setting, example, summary)
    return SearchRun(search, pool, table, summary)


def _pool_searches(evaluator: PrefixTreeEvaluator, table: BlockLatencyTable, budget_s: float,
                   delta: float, levels: Sequence[float], population: int, iterations: int,
                   seed: int) -> list[AdaptiveSearch]:
    """Shorter searches at smaller budgets (those no subnet fits are skipped)."""
    done = []
    fastest = table.fastest()[1]
    for level in levels:
        if not 0 < level < 1:
            raise ConfigError(f"pool levels are fractions of the budget in (0, 1); got {level}")
        if budget_s * level < fastest:
            continue
        search = AdaptiveSearch(budget_s * level, delta=delta * budget_s * level,
                                population=population, iterations=iterations, seed=seed)
        done.append(search.fit(evaluator, table))
    return done


def _arch_row(supernet: ElasticSupernet, data: ElasticData, arch: SubnetArch,
              latency: float) -> dict[str, Any]:
    return {"arch": list(arch), "latency_ms": latency * 1000,
            "relative_macs": relative_macs(supernet, arch),
            "test_accuracy": subnet_accuracy(supernet, arch, data.test.batches(100),
                                             data.metric)}


def _search_summary(supernet: ElasticSupernet, data: ElasticData, search: AdaptiveSearch,
                    pool: SubnetPool, table: BlockLatencyTable, joint: JointLatency | None,
                    budget_s: float, seconds: float, evaluator: PrefixTreeEvaluator
                    ) -> dict[str, Any]:
    best = pool.optimal.arch
    original = supernet.space.original
    summary: dict[str, Any] = {
        "model": supernet.meta["model"], "task": data.task, "metric": data.task,
        "score": SCORES[data.task],  # what "accuracy" below holds
        "latency_model": "joint" if joint is not None else "table",
        "budget_ms": budget_s * 1000, "delta_ms": search.delta_ * 1000,
        "evaluated": len(search.history_), "search_seconds": seconds,
        "evaluation": evaluator.stats.to_dict(),
        "best": {**_arch_row(supernet, data, best, pool.optimal.latency_s),
                 "search_accuracy": pool.optimal.accuracy},
        "search_best": {"arch": list(search.best_arch_),
                        "latency_ms": search.best_latency_ * 1000,
                        "search_accuracy": search.best_accuracy_},
        "original": _arch_row(supernet, data, original, table.predict(original)),
        "curve": [vars(step) for step in search.curve_],
        "history": [{"arch": list(c.arch), "latency_ms": c.metrics["latency"] * 1000,
                     "accuracy": c.metrics["accuracy"], "generation": c.generation}
                    for c in search.history_],
    }
    if joint is not None:
        split = joint.split(best)
        summary["split"] = {"edge_blocks": split.edge_blocks, "blocks": len(best),
                            "edge_ms": split.edge_ms, "transfer_ms": split.transfer_ms,
                            "cloud_ms": split.cloud_ms, "rtt_ms": split.rtt_ms}
    return summary


def _save_search(out: Path, folder: str | Path, supernet: ElasticSupernet,
                 pool: SubnetPool, table: BlockLatencyTable,
                 joint: JointLatency | None, setting: EdgeCloudSetting | None,
                 example: tuple[torch.Tensor, ...], summary: dict[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    pool.save(out / POOL_FILE)
    if joint is None:
        table.save(out / TABLE_FILE)
    best = pool.optimal.arch
    edge_blocks = joint.split(best).edge_blocks if joint is not None else len(best)
    one = tuple(x[:1] for x in example)
    _, plan = plan_subnet(supernet, best, _plan_setting(setting), one,
                          edge_blocks=edge_blocks, model_path=out / MODEL_FILE)
    plan.save(out / PLAN_FILE)
    summary["supernet"] = str(Path(folder).resolve())
    summary["plan"] = {"file": PLAN_FILE, "model": MODEL_FILE,
                       "predicted_ms": plan.predicted.total_ms}
    write_json(out / SEARCH_FILE, summary)


# ---- on the device: serve and switch --------------------------------------------------------

def _serving_latencies(supernet: ElasticSupernet, pool: SubnetPool,
                       inputs: tuple[torch.Tensor, ...], repeats: int,
                       rounds: int = CALIBRATION_ROUNDS) -> dict[SubnetArch, float]:
    """Each pool subnet's median latency through a static runner: the serving path (thread
    hand-off included), so the monitor's ``r`` is 1 when nothing else runs. The subnets take
    turns, ``rounds`` blocks of ``repeats // rounds`` requests each (the first of a block,
    just switched to, dropped): a slow spell of the machine then weighs on every subnet
    alike, where timed one after another it set whichever subnet ran then (the optimal
    subnet's, which scales the budget, included) 5-10 % off for the whole run."""
    block = max(2, -(-repeats // rounds))
    samples: dict[SubnetArch, list[float]] = {e.arch: [] for e in pool}
    with AdaptiveRunner(supernet, LatencyMonitor(pool), adapt=False) as runner:
        for i in range(WARM_UP):  # a fresh worker thread's first calls are slow
            runner(*(x[i % len(x):i % len(x) + 1] for x in inputs))
        for _ in range(rounds):
            for entry in pool:
                runner.switch_to(entry.arch)
                for i in range(block):
                    reply = runner(*(x[i % len(x):i % len(x) + 1] for x in inputs))
                    if i:
                        samples[entry.arch].append(reply.latency_s)
    return {arch: statistics.median(times) for arch, times in samples.items()}


def _calibrated(pool: SubnetPool, measured: dict[SubnetArch, float]) -> SubnetPool:
    """The pool at its serving-path latencies, the budget scaled by the optimal subnet's
    measured / predicted ratio (a tiny model's per-request overhead would otherwise put
    every subnet over a budget set from tight-loop timings)."""
    scale = calibration_scale(pool, measured)
    delta = None if pool.delta_s is None else pool.delta_s * scale
    return SubnetPool([(e.arch, measured[e.arch], e.accuracy) for e in pool],
                      pool.budget_s * scale, delta, meta={**pool.meta, "calibrated": scale})


def calibration_scale(pool: SubnetPool, measured: dict[SubnetArch, float]) -> float:
    """What serving scales the search's budget by: the optimal subnet's serving-path latency
    over the latency the search gave it."""
    return measured[pool.optimal.arch] / pool.optimal.latency_s


def budget_note(doc: dict[str, Any]) -> str | None:
    """One line saying why a ``serve_pool`` document's budget is not the search's (None when
    serving kept it): which number it is and what it was scaled by."""
    c = doc.get("calibration")
    searched = doc.get("searched_budget_ms")
    if not c or searched is None or abs(doc["budget_ms"] - searched) <= 1e-9 * searched:
        return None
    return (f"budget {doc['budget_ms']:.4g} ms, not the search's {searched:.4g} ms: scaled "
            f"x{c['scale']:.3g}, the optimal subnet's serving-path latency here "
            f"({c['optimal_measured_ms']:.4g} ms, median of {c['requests']} requests in turns "
            "with the other subnets) over "
            f"the search's {c['optimal_predicted_ms']:.4g} ms for it; the pool's subnets are "
            "timed the same way")


def serve_pool(folder: str | Path, *, requests: int = 600, load_from: float = 0.3,
               load_until: float = 0.7, load: str = "cpu", processes: int = 2,
               factor: float = 3.0, threads: int = 1, calibrate: int = 45,
               cooldown_requests: int = COOLDOWN_REQUESTS, cooldown_s: float = COOLDOWN_S,
               confirm: int = CONFIRM, tolerance: float = TOLERANCE,
               progress: Progress | None = None) -> dict[str, Any]:
    """Serve ``requests`` single-sample requests with the pool of a search folder, under a
    load from request ``load_from * requests`` to ``load_until * requests``: ``cpu`` (real
    background processes) or ``slowdown`` (each request sleeps to ``factor`` times its
    compute: deterministic). A switch up waits ``cooldown_requests`` requests and
    ``cooldown_s`` seconds after the last switch, and every switch waits for its verdict to
    hold on ``confirm`` requests and for the latency to exceed the budget by ``tolerance``
    (:class:`~.monitor.LatencyMonitor`).
    Returns the switch events, reaction and recovery times, the flapping count
    (:func:`~.monitor.count_flaps`) and every request (time, latency, subnet) for plots;
    ``budget_ms`` is the budget served, the search's (``searched_budget_ms``) scaled as
    ``calibration`` says (:func:`budget_note`): the pool's latencies are timed on the serving
    path first, ``calibrate`` requests per subnet in turns (:func:`_serving_latencies`)."""
    if load not in ("cpu", "slowdown"):
        raise ConfigError(f"{option('load', load)} must be cpu or slowdown")
    if not 0 <= load_from < load_until <= 1:
        raise ConfigError(f"need 0 <= {option('load_from', load_from)} < "
                          f"{option('load_until', load_until)} <= 1 (fractions of the run)")
    folder = Path(folder)
    summary = _read_search(folder)
    supernet, _ = load_supernet(summary["supernet"])
    pool = SubnetPool.load(folder / POOL_FILE, space=supernet.space)
    data = trained_data(supernet)
    inputs = data.test.example(min(len(data.test), SERVED_INPUTS))
    searched_budget_ms, calibration = pool.budget_s * 1000, None
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        if calibrate:
            measured = _serving_latencies(supernet, pool, inputs, calibrate)
            calibration = {"scale": calibration_scale(pool, measured),
                           "optimal": list(pool.optimal.arch),
                           "optimal_predicted_ms": pool.optimal.latency_s * 1000,
                           "optimal_measured_ms": measured[pool.optimal.arch] * 1000,
                           "requests": calibrate}
            pool = _calibrated(pool, measured)
        monitor = LatencyMonitor(pool, cooldown_requests=cooldown_requests,
                                 cooldown_s=cooldown_s, confirm=confirm, tolerance=tolerance)
        served = _serve(supernet, monitor, inputs, requests, (load_from, load_until), load,
                        processes, factor, progress)
    finally:
        torch.set_num_threads(previous)
    # the budget served is the search's scaled to the serving path: say by what
    return {**served, "searched_budget_ms": searched_budget_ms, "calibration": calibration}


def _read_search(folder: Path) -> dict[str, Any]:
    path = folder / SEARCH_FILE
    summary = read_document(folder, SEARCH_FILE, what="search result",
                            fix="run `edgesplit nas adaptivenet search SUPERNET --out DIR` first")
    if "supernet" not in summary:
        raise ConfigError(f"{path} does not name its supernet; search again with --out")
    return summary


def _switch_load(on: bool, slowdown: Slowdown | None, cpu: CpuLoad | None, factor: float,
                 marks: dict[str, float], now: float) -> None:
    marks["load_on" if on else "load_off"] = now
    if slowdown is not None:
        slowdown.set(factor if on else 1.0)
    elif cpu is not None:
        (cpu.resume if on else cpu.pause)()


def _warm_up(runner: AdaptiveRunner, inputs: tuple[torch.Tensor, ...], pool: SubnetPool,
             count: int = WARM_UP) -> None:
    """A few requests on a fresh worker thread (its first calls are slow), then back to the
    optimal subnet with the monitor's window emptied, so the run starts where the search left
    it and the warm-up's slow first calls count towards no verdict."""
    for i in range(count):
        runner(*(x[i % len(x):i % len(x) + 1] for x in inputs))
    runner.switch_to(pool.optimal.arch)
    runner(*(x[:1] for x in inputs))
    runner.monitor.reset()  # the worker is idle: each call above returned after its observe


def _serve(supernet: ElasticSupernet, monitor: LatencyMonitor,
           inputs: tuple[torch.Tensor, ...], requests: int, window: tuple[float, float],
           load: str, processes: int, factor: float, progress: Progress | None
           ) -> dict[str, Any]:
    first, last = int(window[0] * requests), int(window[1] * requests)
    if first >= last:  # before the load's processes start
        raise ConfigError(f"the load window {window[0]}-{window[1]} of {requests} requests "
                          f"holds no request; widen it or serve more {option('requests')}")
    slowdown = Slowdown(1.0) if load == "slowdown" else None
    cpu = CpuLoad(processes).prepare() if load == "cpu" else None
    pool = monitor.pool
    marks: dict[str, float] = {}
    try:
        with AdaptiveRunner(supernet, monitor, hook=slowdown) as runner:
            _warm_up(runner, inputs, pool)
            marks["start"] = monitor.clock()
            for i in range(requests):
                if i in (first, last):
                    _switch_load(i == first, slowdown, cpu, factor, marks, monitor.clock())
                n = len(inputs[0])
                runner(*(x[i % n:i % n + 1] for x in inputs))
                if progress is not None and (i + 1) % 20 == 0:
                    progress("requests", i + 1, requests)
            if "load_off" not in marks:  # the load ran to the end of the run
                _switch_load(False, slowdown, cpu, factor, marks, monitor.clock())
            records = [r for r in runner.records if r.start_s >= marks["start"]]
            events = [e for e in runner.events if e.time_s >= marks["start"]]
            reaction = runner.reaction_time(marks["load_on"])
            recovery = runner.recovery_time(marks["load_on"])
            back = runner.reaction_time(marks["load_off"])
            flaps = count_flaps(events, lambda arch: pool.entry(arch).latency_s,
                                [(marks["start"], None), (marks["load_on"], "down"),
                                 (marks["load_off"], "up")])
    finally:
        if cpu is not None:
            cpu.stop()
    start = marks["start"]
    return {
        "load": load, "processes": processes if load == "cpu" else 0,
        "factor": factor if load == "slowdown" else None, "requests": requests,
        "budget_ms": pool.budget_s * 1000,
        "pool": [e.to_dict() for e in pool],
        "load_on_s": marks["load_on"] - start, "load_off_s": marks["load_off"] - start,
        "reaction_s": reaction, "recovery_s": recovery, "switch_back_s": back,
        "flaps": flaps, "cooldown": {"requests": monitor.cooldown_requests,
                                     "seconds": monitor.cooldown_s},
        "confirm": monitor.confirm, "tolerance": monitor.tolerance,
        "events": [{**e.to_dict(), "time_s": e.time_s - start} for e in events],
        "records": [{"start_s": r.start_s - start, "latency_ms": r.latency_s * 1000,
                     "arch": list(r.arch)} for r in records],
        "over_budget": sum(r.latency_s > pool.budget_s for r in records),
    }

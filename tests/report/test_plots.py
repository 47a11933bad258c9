"""PNG figures of edgesplit.report.plots, on synthetic documents and on one real plan."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from edgesplit.errors import ConfigError
from edgesplit.report.plots import (
    plot_cut_breakdown,
    plot_link_sweep,
    plot_profile,
    short_layer_name,
)
from edgesplit.report.plots._figure import _thinned_ticks, _unique_short_names

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def assert_png(path: Path, min_bytes: int = 5_000, max_bytes: int = 3_000_000) -> None:
    assert path.is_file()
    data = path.read_bytes()
    assert data.startswith(PNG_MAGIC)
    assert min_bytes < len(data) < max_bytes


def synthetic_sweep(points: int = 6) -> dict:
    rows = []
    for i in range(points):
        mbps = 0.1 * 10 ** (4 * i / max(points - 1, 1))
        edge_layers = min(20, int(20 / (1 + i)))
        rows.append({"bandwidth_mbps": mbps, "methods": {
            "neurosurgeon": {"total_ms": 30 + 500 / mbps, "edge_layers": edge_layers,
                             "last_edge_layer": f"layer{edge_layers - 1}" if edge_layers else None,
                             "sent_bytes": 4096 * (i + 1), "feasible": True},
            "cloud_only": {"total_ms": 5 + 5000 / mbps, "edge_layers": 0,
                           "last_edge_layer": None, "sent_bytes": 602112, "feasible": i > 1},
            "edge_only": {"total_ms": 32.0, "edge_layers": 20, "last_edge_layer": "fc",
                          "sent_bytes": 0, "feasible": True},
        }})
    return {"version": 1, "model": "toy", "link": "wifi", "points": rows}


def synthetic_rows(n: int) -> list[dict]:
    rows = []
    for index in range(-1, n - 1):
        last = index == n - 2
        edge = 2.0 * (index + 1)
        transfer = 0.0 if last else 100.0 / (index + 2)
        cloud = 0.0 if last else 0.5 * (n - 2 - index)
        rtt = 0.0 if last else 5.0
        rows.append({"index": index,
                     "after": None if index < 0 else f"model.stage{index // 4}.block{index}.conv",
                     "edge_ms": edge, "transfer_ms": transfer, "cloud_ms": cloud,
                     "rtt_ms": rtt, "total_ms": edge + transfer + cloud + rtt,
                     "sent_bytes": 0 if last else 1000 * (n - index)})
    return rows


def synthetic_profile(n: int = 12, onnx: bool = True) -> dict:
    layers = []
    for i in range(n):
        median = 0.1 + 0.3 * ((i * 7) % n)
        layers.append({
            "name": f"encoder.layers.{i}.attention.output.dense", "op": "linear",
            "eager_ms": {"median": median, "p10": median * 0.9, "p90": median * 1.2},
            "onnx_ms": ({"median": median * 0.7, "p10": median * 0.65, "p90": median * 0.8}
                        if onnx and i % 5 else None),
        })
    return {"version": 1, "kind": "edgesplit-profile", "model": "toy", "layers": layers,
            "whole_model": {"eager_ms": {"median": 12.3, "p10": 12.0, "p90": 13.0},
                            "onnx_ms": None}}


def test_link_sweep(tmp_path: Path) -> None:
    out = plot_link_sweep(synthetic_sweep(), tmp_path / "nested" / "dir" / "sweep.png")
    assert out == tmp_path / "nested" / "dir" / "sweep.png"
    assert_png(out)


def test_link_sweep_single_point_and_str_path(tmp_path: Path) -> None:
    sweep = synthetic_sweep(1)
    sweep["points"][0]["methods"]["edge_only"]["total_ms"] = math.inf  # not drawable: masked
    out = plot_link_sweep(sweep, str(tmp_path / "one.png"), title="custom")
    assert isinstance(out, Path)
    assert_png(out)


def test_link_sweep_empty_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError):
        plot_link_sweep({"model": "m", "link": "l", "points": []}, tmp_path / "x.png")


@pytest.mark.parametrize("n", [2, 13, 300])
def test_cut_breakdown(tmp_path: Path, n: int) -> None:
    out = plot_cut_breakdown(synthetic_rows(n), tmp_path / f"cuts{n}.png", title=f"{n} cuts")
    assert_png(out)


def test_thinned_ticks_keep_ends_and_best() -> None:
    ticks = _thinned_ticks(300, [151])
    assert ticks[0] == 0 and ticks[-1] == 299 and 151 in ticks
    assert len(ticks) <= 45
    assert _thinned_ticks(10, [3]) == list(range(10))


def test_short_layer_name() -> None:
    assert short_layer_name(None) == "input"
    assert short_layer_name("a.b.c.d") == "c.d"
    assert short_layer_name("fc") == "fc"
    names = [None, "enc.stages.0.layers.1.add", "enc.stages.1.layers.1.add", "enc.pooler",
             "x.y", "x.y"]
    assert _unique_short_names(names) == [
        "input", "0.layers.1.add", "1.layers.1.add", "enc.pooler", "x.y", "x.y"]


@pytest.mark.parametrize("onnx", [True, False])
def test_profile(tmp_path: Path, onnx: bool) -> None:
    out = plot_profile(synthetic_profile(onnx=onnx), tmp_path / "profile.png", top=8)
    assert_png(out)


def test_profile_top_must_be_positive(tmp_path: Path) -> None:
    with pytest.raises(ConfigError):
        plot_profile(synthetic_profile(), tmp_path / "p.png", top=0)


def test_real_plan_figures(tmp_path: Path) -> None:
    from edgesplit.hardware import get_device, get_link
    from edgesplit.plan import EdgeCloudSetting, PlanningProblem, cut_breakdown, sweep_link

    s = EdgeCloudSetting(edge=get_device("jetson-nano"), cloud=get_device("v100-server"),
                         link=get_link("wifi"))
    prob = PlanningProblem("resnet18", s)
    rows = cut_breakdown(prob)
    sweep = sweep_link(prob, ["neurosurgeon", "qdmp", "cloud_only", "edge_only"], points=8)
    assert_png(plot_cut_breakdown(rows, tmp_path / "cuts.png", title="resnet18 over wifi"))
    assert_png(plot_link_sweep(sweep, tmp_path / "sweep.png"))


def test_search_progress_and_accuracy_latency_figures(tmp_path):
    from edgesplit.report.plots import plot_accuracy_latency, plot_search_progress

    history = [{"epoch": e, "phase": "warm-up" if e < 2 else "search", "accuracy": 10.0 + 8 * e,
                "expected_ms": 2.0 - 0.1 * e} for e in range(8)]
    runs = {"chain, 1.5 ms": {"history": history, "latency_budget_ms": 1.5},
            "chain, 1.2 ms": {"history": history[:6], "latency_budget_ms": 1.2}}
    assert_png(plot_search_progress(runs, tmp_path / "fig5.png"))
    points = [{"method": "JMSNAS", "latency_ms": 1.4, "accuracy": 97.0, "label": "1.5 ms"},
              {"method": "cloud-only", "latency_ms": 1.9, "accuracy": 97.0}]
    assert_png(plot_accuracy_latency(points, tmp_path / "fig6.png"))
    with pytest.raises(ConfigError, match="no history"):
        plot_search_progress({"x": {"history": [], "latency_budget_ms": 1}}, tmp_path / "x.png")


def test_llm_methods_figure(tmp_path):
    from edgesplit.report.plots import plot_llm_methods

    methods = {name: {"tokens_per_s": rate, "ttft_ms": ttft,
                      "predicted": {"tokens_per_s": rate * 1.05, "ttft_ms": ttft * 0.97}}
               for name, rate, ttft in (("dp", 29.0, 133.0), ("memory_proportional", 11.3, 365.0),
                                        ("single_device", 11.4, 97.0))}
    assert_png(plot_llm_methods(methods, tmp_path / "llm.png", title="llama_1b"))
    with pytest.raises(ConfigError, match="no methods"):
        plot_llm_methods({}, tmp_path / "x.png")


@pytest.fixture
def drawn(monkeypatch):
    """What each NAS / AdaptiveNet figure held when saved: per axes its limits and
    collections, and every legend text (the axes' and the figure's)."""
    import edgesplit.report.plots.adaptivenet as adaptivenet_plots
    import edgesplit.report.plots.nas as nas_plots

    figures: list[dict] = []
    original = nas_plots._save

    def save(fig, path):
        legends = [*fig.legends, *(ax.get_legend() for ax in fig.axes if ax.get_legend())]
        figures.append({
            "axes": [{"xlim": ax.get_xlim(), "ylim": ax.get_ylim(), "xlabel": ax.get_xlabel(),
                      "collections": list(ax.collections),
                      "texts": [t.get_text() for t in ax.texts]} for ax in fig.axes],
            "legend": [t.get_text() for legend in legends for t in legend.get_texts()]})
        return original(fig, path)

    monkeypatch.setattr(nas_plots, "_save", save)
    monkeypatch.setattr(adaptivenet_plots, "_save", save)
    return figures


def _inside(lim: tuple[float, float], value: float) -> bool:
    return min(lim) <= value <= max(lim)


def test_accuracy_latency_keeps_every_point_in_view(tmp_path, drawn):
    from edgesplit.report.plots import plot_accuracy_latency

    points = [{"method": "JMSNAS", "latency_ms": 0.47, "accuracy": 97.8, "label": "0.51 ms"},
              {"method": "JMSNAS", "latency_ms": 1.07, "accuracy": 99.3, "label": "1.96 ms"},
              {"method": "cloud-only", "latency_ms": 250.0, "accuracy": 99.7},  # far out
              {"method": "baseline a", "latency_ms": 0.81, "accuracy": 98.8},
              {"method": "baseline b", "latency_ms": 0.81, "accuracy": 98.8},  # same point
              {"method": "no plan", "latency_ms": None, "accuracy": 98.0}]
    assert_png(plot_accuracy_latency(points, tmp_path / "fig6.png"))
    ax = drawn[-1]["axes"][0]
    for p in points[:-1]:
        assert _inside(ax["xlim"], p["latency_ms"]) and _inside(ax["ylim"], p["accuracy"])
    sizes = {c.get_label(): c.get_sizes()[0] for c in ax["collections"]}
    assert sizes["baseline a"] > sizes["baseline b"]  # stacked: both stay visible
    assert "2 at one point" in ax["texts"]
    assert "no plan" in ax["xlabel"]  # a point with no value is named, not silently dropped


def test_search_progress_keeps_budgets_in_view(tmp_path, drawn):
    from edgesplit.report.plots import plot_search_progress

    history = [{"epoch": e, "phase": "search", "accuracy": 50.0 + e, "expected_ms": 2.0}
               for e in range(4)]
    runs = {"tight": {"history": history, "latency_budget_ms": 0.2}}
    assert_png(plot_search_progress(runs, tmp_path / "fig5.png"))
    latency = drawn[-1]["axes"][1]
    assert _inside(latency["ylim"], 0.2) and _inside(latency["ylim"], 2.0)


def test_search_front_marks_infeasible_points(tmp_path, drawn):
    from edgesplit.report.plots import plot_search_front

    limit = 128 * 1024
    candidates = [{"latency_ms": 0.02 * (1 + i), "accuracy": 90.0 + i,
                   "sensor_memory_bytes": 60_000 * (1 + i)} for i in range(4)]
    front = candidates[:2]
    baselines = [{"method": "SplitNets", "label": "front-0", "latency_ms": 0.02,
                  "accuracy": 90.0, "fits": True},
                 {"method": "late fusion", "label": "", "latency_ms": 0.15, "accuracy": 78.5,
                  "sensor_memory_bytes": 259_312, "fits": False}]
    assert_png(plot_search_front(candidates, front, tmp_path / "front.png", baselines=baselines,
                                 memory_limit_bytes=limit, rejected=230))
    fig = drawn[-1]
    ax = fig["axes"][0]
    assert any(t.startswith("hollow: infeasible (over the 128 KiB sensor memory")
               for t in fig["legend"])
    assert "230 more drawn over the memory limit and skipped (not drawn)" in fig["legend"]
    assert "candidates over the sensor memory (2)" in fig["legend"]
    late = next(c for c in ax["collections"] if c.get_label() == "late fusion")
    assert late.get_facecolors().size == 0 or late.get_facecolors()[0][3] == 0  # hollow
    assert "253 KiB > 128 KiB" in ax["texts"]
    for p in [*candidates, *baselines]:
        assert _inside(ax["xlim"], p["latency_ms"]) and _inside(ax["ylim"], p["accuracy"])
    # without a limit or a fits flag nothing is marked, as before
    assert_png(plot_search_front(candidates, front, tmp_path / "plain.png"))
    assert not any("infeasible" in t for t in drawn[-1]["legend"])


def test_adaptivenet_figures_use_the_tables_names(tmp_path, drawn):
    from edgesplit.report.plots import plot_search_efficiency, plot_switching

    curves = {"AdaptiveNet": [{"evaluated": 10, "best_accuracy": 0.95},
                              {"evaluated": 19, "best_accuracy": 0.9633}],
              "evolution": [{"evaluated": 10, "best_accuracy": 0.9633}]}
    assert_png(plot_search_efficiency(curves, tmp_path / "search.png", target=0.9633))
    assert drawn[-1]["legend"] == ["AdaptiveNet", "evolution", "target 0.9633"]
    pool = [{"arch": ["b0-1", "b1", "b2+1"]}, {"arch": ["b0", "b1", "b2"]}]
    records = [{"start_s": i * 0.01, "latency_ms": 2.0 + (i % 3),
                "arch": pool[0 if 30 <= i < 70 else 1]["arch"]} for i in range(100)]
    doc = {"records": records, "pool": pool, "load": "cpu", "processes": 4,
           "load_on_s": 0.3, "load_off_s": 0.7, "budget_ms": 2.94,
           "events": [{"time_s": 0.31}, {"time_s": 0.71}]}
    assert_png(plot_switching(doc, tmp_path / "switching.png"))
    legend = drawn[-1]["legend"]
    assert "b0-1-b1-b2+1 (40 requests)" in legend and "b0-b1-b2 (60 requests)" in legend
    assert {"budget 2.94 ms", "switches (2)", "load: 4 background processes"} <= set(legend)

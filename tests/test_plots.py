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

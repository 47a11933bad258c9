"""Rich tables for planning results."""

from __future__ import annotations

from typing import Any

from rich.table import Table

from edgesplit.plan import Plan, PlanningProblem
from edgesplit.report.format import human_bytes

__all__ = ["outputs_table", "plans_table", "run_table", "sweep_table", "topology_table"]


def _split(plan: Plan, total_layers: int) -> str:
    edge = plan.edge_layers
    if not edge:
        return "cloud-only"
    if len(edge) == total_layers:
        return "edge-only"
    return f"after {edge[-1]}"


def plans_table(problem: PlanningProblem, plans: dict[str, Plan], chosen: str) -> Table:
    s = problem.edge_cloud
    limit = s.memory_limit_bytes
    notes = {m: p.reason for m, p in plans.items() if p.feasible and p.reason}
    table = Table(title=f"{problem.graph.model}: {s.edge.name} -> {s.link.name} "
                        f"({s.link.bandwidth_mbps:g} Mbps, RTT {s.link.rtt_ms:g} ms) -> "
                        f"{s.cloud.name}; edge memory limit "
                        f"{human_bytes(limit) if limit else 'none'}",
                  caption=f"chosen: {chosen}" + "".join(f"\n{m}: {r}"
                                                         for m, r in notes.items())
                  + _lossy_inputs(problem, plans))
    for col in ("method", "graph", "split", "edge layers", "bits", "sent", "edge ms",
                "transfer ms", "serialize ms", "cloud ms", "total ms", "edge memory",
                "accuracy drop", "feasible"):
        table.add_column(col, overflow="fold", justify="right" if "ms" in col else "left")
    for method, plan in plans.items():
        n = len(problem.graph_of(plan.model.graph).layers)
        p = plan.predicted
        table.add_row(
            ("* " if method == chosen else "") + method, plan.model.graph, _split(plan, n),
            f"{len(plan.edge_layers)}/{n}", _bits(plan), human_bytes(plan.transfers[0].bytes),
            f"{p.compute_ms['edge']:.2f}", f"{p.transfer_ms + p.rtt_ms:.2f}",
            f"{p.serialize_ms:.2f}", f"{p.compute_ms['cloud']:.2f}", f"{p.total_ms:.2f}",
            human_bytes(plan.edge_memory_bytes), _drop(plan),
            "yes" if plan.feasible else f"no: {plan.reason}")
    return table


def _lossy_inputs(problem: PlanningProblem, plans: dict[str, Plan]) -> str:
    """A caption line naming the plans whose raw float inputs cross the link rounded
    (``--input-bits`` below 32), so that no lossy crossing goes unsaid."""
    inputs = set(problem.graph.inputs)
    rounded = {m: b for m, p in plans.items() for t in p.transfers for name, b in t.bits.items()
               if name in inputs and b < 32}
    if not rounded:
        return ""
    return (f"\nlossy: the model input crosses at {max(rounded.values())} bits in "
            f"{', '.join(rounded)} (--input-bits; 32 sends it exactly)")


def _bits(plan: Plan) -> str:
    """Weight/activation widths of the quantized layers, e.g. ``w4-8 a8``; ``float`` if none."""
    ws = sorted({layer.w_bits for layer in plan.layers if layer.w_bits is not None})
    acts = sorted({layer.a_bits for layer in plan.layers if layer.a_bits is not None})
    if not ws:
        return "fp16 cloud" if plan.method == "cloud16" else "float"

    def span(v: list[int]) -> str:
        return f"{v[0]}" if len(v) == 1 else f"{v[0]}-{v[-1]}"

    return f"w{span(ws)} a{span(acts)}"


def _drop(plan: Plan) -> str:
    if plan.quality is not None:
        return f"{plan.quality.drop:.2f} pts"
    if any(layer.w_bits is not None for layer in plan.layers) or plan.method == "cloud16":
        return "not measured"
    return "0 (float)"


def sweep_table(sweep: dict[str, Any]) -> Table:
    table = Table(title=f"{sweep['model']}: best feasible plan as the uplink grows "
                        f"(plot: {sweep.get('plot', '-')})")
    for col in ("Mbps", "best method", "total ms", "split"):
        table.add_column(col)
    for row in sweep["points"]:
        feasible = {m: r for m, r in row["methods"].items() if r["feasible"]}
        if not feasible:
            table.add_row(f"{row['bandwidth_mbps']:.3g}", "-", "-", "infeasible")
            continue
        method, best = min(feasible.items(), key=lambda kv: kv[1]["total_ms"])
        split = ("cloud-only" if best["edge_layers"] == 0
                 else "edge-only" if best["edge_layers"] == best.get("total_layers")
                 else f"{best['edge_layers']} layers, after {best['last_edge_layer']}")
        table.add_row(f"{row['bandwidth_mbps']:.3g}", method, f"{best['total_ms']:.2f}", split)
    return table


def topology_table(doc: dict[str, Any], plans: dict[str, Plan]) -> Table:
    topo = doc["topology"]
    hops = ", ".join(f"{l['src']}->{l['dst']} {l['bandwidth_mbps']:g} Mbps" for l in topo["links"])
    caption = f"chosen: {doc['best']}"
    if doc["best"] in plans and not plans[doc["best"]].runnable:
        caption += (" (predicted only: the runtime executes chains, stars and meshes of "
                    "JMSNAS's shape; best_chain is the best chain it can run)")
    table = Table(title=f"{doc['model']} over {topo['name']}: {hops}; objective "
                        f"{doc['objective']}", caption=caption)
    table.add_column("method")
    for device in topo["devices"]:
        table.add_column(f"{device} layers / ms", justify="right")
    for col in ("sent per link", "total ms", "period ms", "feasible", "runs"):
        table.add_column(col, justify="right")
    for method, plan in plans.items():
        entry = doc["methods"][method]
        held = {d.name: d for d in plan.devices}
        cells = [f"{len(held[n].layers)} / {held[n].compute_ms:.2f}" if n in held else "-"
                 for n in topo["devices"]]
        sent = ", ".join(f"{t.src}->{t.dst} {human_bytes(t.bytes)}" for t in plan.transfers
                         if t.tensors or not set(plan.parallel_devices) & {t.src, t.dst})
        table.add_row(("* " if method == doc["best"] else "") + method, *cells, sent,
                      f"{entry['total_ms']:.2f}", f"{entry['period_ms']:.2f}",
                      "yes" if plan.feasible else f"no: {plan.reason}",
                      "yes" if plan.runnable else "predicted only")
    return table


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def run_table(report: dict[str, Any]) -> Table:
    """Measured (mean) against predicted latency of `edgesplit run`."""
    lat = report["latency_ms"]
    diff = report["max_abs_diff"]
    # a star's sources run side by side, then its sink
    route = (f"{', '.join(report['sources'])} -> {report['sink']}" if report.get("sink")
             else ' -> '.join(report['devices']))
    table = Table(title=f"{report['model']} ({report['method']}) over "
                        f"{route}: {report['ok']}/{report['requests']} "
                        f"ok, max |output - unsplit| "
                        f"{'-' if diff is None else format(diff, '.3g')}",
                  caption=f"latency p50 {_ms(lat['p50'])} ms, p95 {_ms(lat['p95'])} ms, max "
                          f"{_ms(lat['max'])} ms; {_ms(report['throughput_rps'])} requests/s",
                  min_width=72)
    table.add_column("part")
    table.add_column("measured ms (mean)", justify="right")
    table.add_column("predicted ms", justify="right")
    predicted = report.get("predicted_breakdown_ms", {})
    for key in ("edge", "serialize", "transfer", "remote", "total"):
        table.add_row(key, _ms(report["breakdown_ms"][key]), _ms(predicted.get(key)))
    for device, ms in report.get("emulated_ms", {}).items():  # part of edge / remote above
        table.add_row(f"  {device} emulated (slept)", _ms(ms), "")
    for message in report.get("error_messages", []):
        table.add_row("error", message, "")
    return table


def outputs_table(doc: dict[str, Any], file: str | None = None, shown: int = 10) -> Table:
    """The first ``shown`` rows of a run's outputs (``RunOutputs.document()`` with its values
    inline): a classifier's top-1 class split and unsplit, and |output - unsplit| per row."""
    unit, count = doc["unit"], doc["count"]
    hidden = f"{count - shown} more {unit}s; " if count > shown else ""
    more = f"{hidden}every {unit} in {file}" if file else f"{hidden}--out FILE.npz writes them"
    agree = (f"; top-1 agrees with the unsplit model on {doc['top1_agree']}/{doc['answered']}"
             if doc["classifier"] else "")
    acc = doc.get("accuracy")
    if acc and acc["split"] is not None:  # the inputs file had labels
        agree += f"; accuracy {acc['split']:.3f} (unsplit {acc['unsplit']:.3f})"
    table = Table(title=f"outputs: {doc['answered']}/{count} {unit}s answered{agree}",
                  caption=more, min_width=72)
    table.add_column(unit)
    if doc["classifier"]:
        table.add_column("top-1", justify="right")
        table.add_column("unsplit top-1", justify="right")
    table.add_column("max |output - unsplit|", justify="right")
    for i, diff in enumerate(doc["max_abs_diff"][:shown]):
        labels = ([str(doc["top1_labels"][i]), str(doc["unsplit_top1_labels"][i])]
                  if doc["classifier"] else [])
        table.add_row(str(i), *labels, "-" if diff is None else format(diff, ".3g"))
    return table

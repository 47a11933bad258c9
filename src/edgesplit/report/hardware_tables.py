"""Rich tables for devices, links, topologies, profiles and estimator validation."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.table import Table

from edgesplit.hardware.device import AnalyticalCompute, Device
from edgesplit.hardware.link import Link
from edgesplit.hardware.topology import Topology
from edgesplit.report.format import human_bytes

__all__ = [
    "devices_table",
    "links_table",
    "profile_table",
    "topologies_table",
    "validation_table",
]


def _peak(device: Device) -> str:
    if not isinstance(device.compute, AnalyticalCompute):
        return f"measured ({device.compute.profile})"
    return ", ".join(f"{g:g} GOP/s @{b}b" for b, g in sorted(device.compute.peak_gops.items()))


def devices_table(devices: Sequence[Device]) -> Table:
    table = Table(title="devices")
    for col in ("name", "kind", "peak", "memory BW", "memory", "on-chip", "bits", "source"):
        table.add_column(col, overflow="fold")
    for d in devices:
        bw = (f"{d.compute.memory_bandwidth_gb_per_s:g} GB/s"
              if isinstance(d.compute, AnalyticalCompute) else "-")
        table.add_row(d.name, d.kind, _peak(d), bw,
                      human_bytes(d.memory_bytes) if d.memory_bytes else "-",
                      human_bytes(d.on_chip_memory_bytes) if d.on_chip_memory_bytes else "-",
                      ",".join(map(str, d.supported_bits)), d.source)
    return table


def links_table(links: Sequence[Link]) -> Table:
    table = Table(title="links")
    for col in ("name", "up Mbps", "down Mbps", "RTT ms", "loss", "medium", "source"):
        table.add_column(col, overflow="fold")
    for link in links:
        table.add_row(link.name, f"{link.bandwidth_mbps:g}",
                      f"{link.down_bandwidth_mbps or link.bandwidth_mbps:g}", f"{link.rtt_ms:g}",
                      f"{link.loss:g}", link.medium + (" (shared)" if link.shared else ""),
                      link.source)
    return table


def topologies_table(topologies: Sequence[Topology]) -> Table:
    table = Table(title="topologies")
    for col in ("name", "devices", "links", "source"):
        table.add_column(col, overflow="fold")
    for topo in topologies:
        devices = ", ".join(f"{d.name}" for d in topo.devices)
        links = ", ".join(f"{tl.src}->{tl.dst} {tl.link.bandwidth_mbps:g} Mbps"
                          for tl in topo.links)
        table.add_row(topo.name, devices, links, topo.source)
    return table


def profile_table(profile: dict[str, Any], top: int = 15) -> Table:
    rows = sorted(profile["layers"], key=lambda r: -r["eager_ms"]["median"])[:top]
    whole = profile["whole_model"]
    onnx_whole = whole["onnx_ms"]["median"] if whole.get("onnx_ms") else None
    title = (f"{profile['model']}: whole model {whole['eager_ms']['median']:.3f} ms eager"
             + (f", {onnx_whole:.3f} ms ONNX Runtime" if onnx_whole is not None else "")
             + f"; sum of layers {profile['sum_of_layers_ms']['eager']:.3f} ms")
    table = Table(title=title, caption=f"slowest {len(rows)} of {len(profile['layers'])} layers")
    for col in ("layer", "op", "MACs", "eager ms (median)", "p10-p90", "ONNX ms"):
        table.add_column(col, overflow="fold")
    for r in rows:
        e, o = r["eager_ms"], r.get("onnx_ms")
        table.add_row(r["name"], r["op"], f"{r['macs']:,}", f"{e['median']:.4f}",
                      f"{e['p10']:.4f}-{e['p90']:.4f}", f"{o['median']:.4f}" if o else "-")
    return table


def validation_table(report: dict[str, Any]) -> Table:
    table = Table(title=f"{report['model']}: estimator error on latencies not fitted on "
                        f"(whole model + {len(report['targets']) - 1} partitions)")
    for col in ("estimator", "whole model error %", "MAPE %", "worst %"):
        table.add_column(col)
    for name, stats in report["estimators"].items():
        table.add_row(name, f"{stats['whole_model_error_pct']:.1f}", f"{stats['mape_pct']:.1f}",
                      f"{stats['worst_pct']:.1f}")
    return table


def calibration_table(device: Device) -> Table:
    """A calibrated device's fitted roofline and wire codec (`edgesplit calibrate`)."""
    compute = device.compute
    table = Table(title=f"{device.name}: {device.source}", min_width=60)
    table.add_column("parameter")
    table.add_column("value", justify="right")
    if isinstance(compute, AnalyticalCompute):
        table.add_row("peak FP32 GFLOP/s", f"{compute.peak_gops[max(compute.peak_gops)]:g}")
        for tier in compute.memory_tiers:
            table.add_row(f"memory GB/s, working set <= {human_bytes(tier.max_bytes)}",
                          f"{tier.bandwidth_gb_per_s:g}")
        table.add_row("memory GB/s, larger (off-chip)" if compute.memory_tiers
                      else "memory GB/s", f"{compute.memory_bandwidth_gb_per_s:g}")
        table.add_row("per-layer overhead ms", f"{compute.layer_overhead_ms:.4f}")
        for op_class, eff in compute.efficiency.items():
            table.add_row(f"efficiency {op_class}", f"{eff:.3f}")
        table.add_row("efficiency (other classes)", f"{compute.default_efficiency:.3f}")
    codec = device.codec()
    table.add_row("wire encode / decode GB/s",
                  f"{codec.encode_gb_per_s:g} / {codec.decode_gb_per_s:g}")
    table.add_row("wire 8-bit encode / decode GB/s",
                  f"{codec.quantized_encode_gb_per_s:g} / {codec.quantized_decode_gb_per_s:g}")
    table.add_row("wire per tensor ms (encode / decode)",
                  f"{codec.encode_tensor_ms:.4f} / {codec.decode_tensor_ms:.4f}")
    return table

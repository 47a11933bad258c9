"""A searched SplitNet as a model *and* a Plan the runtime executes, in one folder.

``save_splitnet(folder, supernet, arch, hardware, ...)`` writes

- ``arch.json`` + ``weights.safetensors``: the space, the architecture and the plain
  network's weights (batch-norms recalibrated for it);
- ``model.pt2``: the network exported with ``torch.export``, one input per view;
- ``plan.json``: the network over the sensors and the aggregator: every view's sensor layers
  on its own sensor (where its view is born), View-Fuse / Conv-Recover and the rest on the
  aggregator, priced by the same cost model as any plan (a star plan for several views, a
  two-device chain for one); ``edgesplit serve`` / ``edgesplit run`` execute it;
- ``splitnet.json``: accuracy on the held-out data, the analytic cost the search used next to
  the plan's prediction and the LayerGraph's memory analysis of the sensor part (they agree:
  the memory constraint is checked again on the captured graph, not only on the model of it).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from edgesplit.data import EvalData
from edgesplit.graph import LayerGraph, capture
from edgesplit.graph.memory import peak_memory
from edgesplit.hardware import Topology, estimator_for
from edgesplit.hardware.work import LayerWork
from edgesplit.nas.core.checkpoint import CheckpointFormat
from edgesplit.nas.core.evaluate import top1_accuracy
from edgesplit.nas.core.files import write_json
from edgesplit.nas.splitnets.cost import SplitCost, SplitHardware
from edgesplit.nas.splitnets.space import SplitArch
from edgesplit.nas.splitnets.supernet import SplitNet, SplitSupernet, recalibrate
from edgesplit.nas.splitnets.train import calibration_batches
from edgesplit.plan import Plan
from edgesplit.plan.assemble import Network, assemble_plan

__all__ = ["ARCH_FILE", "MODEL_FILE", "PLAN_FILE", "SUMMARY_FILE", "SplitNetResult",
           "plan_splitnet", "save_splitnet", "view_inputs"]

ARCH_FILE = "arch.json"
WEIGHTS_FILE = "weights.safetensors"
MODEL_FILE = "model.pt2"
PLAN_FILE = "plan.json"
SUMMARY_FILE = "splitnet.json"
FORMAT = "edgesplit.nas.splitnets.network/1"
NETWORK = CheckpointFormat(FORMAT, ARCH_FILE, WEIGHTS_FILE, "searched SplitNet",
                           "search one with `edgesplit nas splitnets search`",
                           "save it again with save_splitnet")


@dataclass(frozen=True)
class SplitNetResult:
    folder: Path
    net: SplitNet
    plan: Plan
    summary: dict[str, Any]


def view_inputs(x: torch.Tensor, views: int, resolution: int) -> tuple[torch.Tensor, ...]:
    """A batch of samples ((B, C, H, W), or (B, V, C, H, W) with views) as the network's
    inputs: one tensor per view at ``resolution``, resized as the supernet resizes."""
    per_view = x.unbind(1) if views > 1 else (x,)
    return tuple(v if v.shape[-1] == resolution and v.shape[-2] == resolution else
                 F.interpolate(v, size=(resolution, resolution), mode="bilinear",
                               align_corners=False, antialias=True) for v in per_view)


def net_accuracy(net: SplitNet, data: EvalData, resolution: int, batch_size: int = 512
                 ) -> float:
    assert data.labels is not None
    return top1_accuracy(lambda x: net(*view_inputs(x, net.views, resolution)), data.inputs[0],
                         data.labels, batch_size)


def _placement(graph: LayerGraph, hardware: SplitHardware, views: int) -> dict[str, list[str]]:
    """Sensor v gets the layers computed from view v alone; the aggregator the rest."""
    roots: dict[str, frozenset[str]] = {}
    for layer in graph.layers:
        found: set[str] = set()
        for t in layer.inputs:
            producer = graph.tensors[t].producer
            found |= {t} if t in graph.inputs else set(roots.get(producer, frozenset()))
        roots[layer.name] = frozenset(found)
    placement: dict[str, list[str]] = {d: [] for d in (*hardware.sensors[:views],
                                                      hardware.aggregator_name)}
    for layer in graph.layers:
        on_sensor = layer.name.startswith("sensor.") and len(roots[layer.name]) == 1
        if on_sensor:
            view = graph.inputs.index(next(iter(roots[layer.name])))
            placement[hardware.sensors[view]].append(layer.name)
        else:
            placement[hardware.aggregator_name].append(layer.name)
    return placement


def plan_splitnet(model_path: Path, hardware: SplitHardware, topology: Topology, views: int,
                  memory_ok: bool) -> tuple[Plan, LayerGraph]:
    """The plan of the exported SplitNet at ``model_path`` over ``hardware``."""
    graph = capture(str(model_path))
    placement = _placement(graph, hardware, views)
    order = [*hardware.sensors[:views], hardware.aggregator_name]
    network = Network.of_topology(topology, order)
    layer_ms = {layer.name: {d.name: estimator_for(d.device).layer_ms(
        LayerWork.of(graph, layer), d.device) for d in network.devices} for layer in graph.layers}
    plan = assemble_plan(
        graph, placement, network, layer_ms=layer_ms, method="splitnets",
        source=str(model_path), edge_memory_bytes=hardware.memory_limit_bytes or 0,
        parallel_devices=tuple(hardware.sensors[:views]) if views > 1 else (),
        input_devices={name: hardware.sensors[v] for v, name in enumerate(graph.inputs)},
        feasible=memory_ok,
        reason=None if memory_ok else "the sensor part exceeds the sensor's memory")
    return plan, graph


def save_splitnet(folder: str | Path, supernet: SplitSupernet, arch: SplitArch,
                  hardware: SplitHardware, topology: Topology, *, calibration: EvalData,
                  test: EvalData | None = None, summary: dict[str, Any] | None = None
                  ) -> SplitNetResult:
    """Extract ``arch`` (batch-norms recalibrated on ``calibration``), export and plan it,
    measure it on ``test``, and write the folder."""
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    space, views = supernet.space, supernet.space.views
    recalibrate(supernet, arch, calibration_batches(calibration))
    net = supernet.extract(arch)
    example = tuple(torch.zeros(1, space.in_channels, arch.resolution, arch.resolution)
                    for _ in range(views))
    model_path = out / MODEL_FILE
    torch.export.save(torch.export.export(net, example), model_path)
    cost = hardware.cost(space, arch)
    plan, graph = plan_splitnet(model_path, hardware, topology, views,
                                hardware.check_memory(cost) == 0)
    plan.save(out / PLAN_FILE)
    NETWORK.save(out, {"space": space.to_dict(), "arch": arch.to_dict()},
                 {k: v.contiguous() for k, v in net.state_dict().items()})
    doc = dict(summary or {})
    doc.update(_checks(graph, plan, cost, hardware))
    doc["arch"], doc["describe"] = arch.to_dict(), arch.describe()
    if test is not None:
        doc["test_accuracy"] = net_accuracy(net, test, arch.resolution)
    write_json(out / SUMMARY_FILE, doc)
    return SplitNetResult(out, net, plan, doc)


def _checks(graph: LayerGraph, plan: Plan, cost: SplitCost, hardware: SplitHardware
            ) -> dict[str, Any]:
    """The search's analytic cost next to the plan's prediction and the LayerGraph's memory
    analysis of one sensor's part."""
    sensor = plan.devices[0]
    memory = peak_memory(graph, sensor.layers)
    limit = hardware.memory_limit_bytes
    return {"cost": cost.to_dict(),
            "plan": {"file": PLAN_FILE, "predicted_ms": plan.predicted.total_ms,
                     "runnable": plan.runnable,
                     "devices": {d.name: len(d.layers) for d in plan.devices}},
            "sensor_memory": {**memory.to_dict(), "limit_bytes": limit,
                              "fits": limit is None or memory.total_bytes <= limit}}

"""Measure per-layer and whole-model latency on this machine, in PyTorch eager and in ONNX
Runtime, and the partitions the estimators are checked against.

Per-layer times are taken *in context*: inside real forward passes, so each layer meets the
cache state it has in the model (a layer called alone in a loop keeps its weights hot and looks
faster than it is). Timing: ``warmup`` passes, then ``repeats`` timed ones; we keep median,
10th/90th percentile, mean and minimum.
"""

from __future__ import annotations

import copy
import io
import itertools
import json
import platform
import statistics
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from edgesplit.errors import ConfigError, GraphError
from edgesplit.graph import LayerGraph
from edgesplit.graph.partition import Partition, copy_layer, extract_partition, record_tensors
from edgesplit.hardware.accelerator import synchronize
from edgesplit.hardware.work import LayerWork

__all__ = [
    "PROFILE_VERSION",
    "load_profile",
    "machine_info",
    "measure_partitions",
    "onnx_available",
    "prefix_partitions",
    "profile_graph",
    "save_profile",
    "time_call",
    "works_and_latencies",
]

PROFILE_VERSION = 1
_CPU = torch.device("cpu")
Progress = Callable[[str, int, int], None]  # (stage, done, total)


def onnx_available() -> bool:
    try:
        import onnx  # noqa: F401
        import onnxruntime  # noqa: F401
    except ImportError:
        return False
    return True


def time_call(fn: Callable[[], Any], *, warmup: int = 3, repeats: int = 20) -> dict[str, float]:
    """Latency statistics of ``fn()`` in milliseconds."""
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter_ns()
        fn()
        samples.append((time.perf_counter_ns() - start) / 1e6)
    return _stats(samples)


def machine_info(device: torch.device | None = None) -> dict[str, Any]:
    """What measured: the host, and the torch device that computed (with its name on CUDA)."""
    info: dict[str, Any] = {"platform": platform.platform(),
                            "processor": platform.processor() or platform.machine(),
                            "python": platform.python_version(), "torch": torch.__version__,
                            "threads": torch.get_num_threads(),
                            "torch_device": str(device or "cpu")}
    if device is not None and device.type == "cuda":
        info["accelerator"] = torch.cuda.get_device_name(device)
    return info


def _onnx_session(part: Partition, args: tuple[torch.Tensor, ...]):
    import onnxruntime as ort

    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # The TorchScript exporter takes milliseconds per layer; the dynamo one about a second.
        # torch annotates f as a path, but this exporter also writes to a binary file object.
        torch.onnx.export(part.module, args, buffer,  # type: ignore[arg-type]  # a BytesIO
                          dynamo=False, input_names=[f"in{i}" for i in range(len(args))])
    options = ort.SessionOptions()
    options.intra_op_num_threads = torch.get_num_threads()
    options.log_severity_level = 3
    session = ort.InferenceSession(buffer.getvalue(), options, providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    return session, names


def _stats(samples: list[float]) -> dict[str, float]:
    q10, q90 = np.percentile(samples, [10, 90])
    return {"median": statistics.median(samples), "p10": float(q10), "p90": float(q90),
            "mean": statistics.fmean(samples), "min": min(samples), "repeats": len(samples)}


def _in_context(steps: list[Callable[[dict], None]], values: dict, warmup: int, repeats: int,
                progress: Progress | None = None, stage: str = "timing"
                ) -> list[dict[str, float]]:
    """Time each step while running all steps in model order, so every layer sees the cache
    state it has inside a real forward pass (weights not already hot, as they would be if the
    layer were called alone in a loop)."""
    samples: list[list[float]] = [[] for _ in steps]
    for run in range(warmup + repeats):
        env = dict(values)
        for i, step in enumerate(steps):
            start = time.perf_counter_ns()
            step(env)
            if run >= warmup:
                samples[i].append((time.perf_counter_ns() - start) / 1e6)
        if progress:
            progress(stage, run + 1, warmup + repeats)
    return [_stats(s) for s in samples]


class _Clock:
    """Timestamps taken by ``tick`` calls compiled into the program between layers. On an
    accelerator each tick first waits for the kernels queued so far: a layer's time is then
    its kernels', not its launches' (the wait itself adds a few microseconds per layer)."""

    def __init__(self, n: int, device: torch.device) -> None:
        self.stamps = [0] * (n + 1)
        self.device = device

    def tick(self, index: int, *_after: Any) -> None:
        synchronize(self.device)
        self.stamps[index] = time.perf_counter_ns()


def _ticked_program(graph: LayerGraph, program: torch.fx.GraphModule,
                    clock: _Clock) -> torch.fx.GraphModule:
    """The whole ``program`` of ``graph`` re-emitted layer by layer (layers are convex and
    topologically ordered, so this is a valid order) with a clock tick after each layer:
    per-layer times inside one real forward pass, at the cost of one Python call per layer (as
    torchprof does with hooks)."""
    fx_nodes = {n.name: n for n in program.graph.nodes}
    new = torch.fx.Graph()
    env: dict = {}
    for node in program.graph.nodes:
        if node.op == "placeholder":
            env[node] = new.node_copy(node)
    new.call_function(clock.tick, (0,))
    for i, layer in enumerate(graph.layers, start=1):
        copy_layer(layer, fx_nodes, new, env)
        new.call_function(clock.tick, (i, *(env[fx_nodes[t]] for t in layer.outputs)))
    output = next(n for n in program.graph.nodes if n.op == "output")
    new.output(torch.fx.node.map_arg(output.args[0], lambda n: env[n]))
    return torch.fx.GraphModule(program, new)


def _eager_in_context(graph: LayerGraph, warmup: int, repeats: int,
                      progress: Progress | None, idle_ms: float = 0.0,
                      device: torch.device = _CPU) -> tuple[list[dict], dict]:
    """Per-layer times from the ticked program and whole-model times of the plain program,
    interleaved run by run so both see the same machine conditions; each run after
    ``idle_ms`` of sleep. On an accelerator, a copy of the program runs there (the graph's
    own stays on the CPU) and each time waits for its kernels."""
    program = graph.program
    if program is None:
        raise GraphError("this LayerGraph has no program to profile (capture it again)")
    args = tuple(graph.example_inputs)
    if device.type != "cpu":
        program = copy.deepcopy(program).to(device)
        args = tuple(a.to(device) for a in args)
    clock = _Clock(len(graph.layers), device)
    ticked = _ticked_program(graph, program, clock)
    samples: list[list[float]] = [[] for _ in graph.layers]
    whole: list[float] = []
    for run in range(warmup + repeats):
        time.sleep(idle_ms / 1e3)
        synchronize(device)
        start = time.perf_counter_ns()
        program(*args)
        synchronize(device)
        elapsed = (time.perf_counter_ns() - start) / 1e6
        time.sleep(idle_ms / 1e3)
        ticked(*args)
        if run >= warmup:
            whole.append(elapsed)
            for i, (a, b) in enumerate(itertools.pairwise(clock.stamps)):
                samples[i].append((b - a) / 1e6)
        if progress:
            progress("timing PyTorch eager", run + 1, warmup + repeats)
    return [_stats(s) for s in samples], _stats(whole)


def _onnx_steps(parts: list[Partition], values: dict, progress: Progress | None = None
                ) -> list[Callable[[dict], None]] | None:
    steps: list[Callable[[dict], None]] = []
    for i, part in enumerate(parts):
        if progress:
            progress("exporting to ONNX", i + 1, len(parts))
        try:
            session, names = _onnx_session(part, tuple(values[n] for n in part.inputs))
        except Exception:  # a layer ONNX cannot express: report eager timings only
            return None

        def step(env: dict, session=session, names=names, part=part) -> None:
            feeds = {name: np.asarray(env[t]) for name, t in zip(names, part.inputs, strict=False)}
            env.update(zip(part.outputs, session.run(None, feeds), strict=True))
        steps.append(step)
    return steps


def profile_graph(graph: LayerGraph, *, warmup: int = 3, repeats: int = 20, onnx: bool = True,
                  progress: Progress | None = None, idle_ms: float = 0.0,
                  device: torch.device | None = None) -> dict[str, Any]:
    """Per-layer and whole-model latency of ``graph`` on this machine (the profile document).

    Per-layer times are taken in context, inside real forward passes (PyTorch: a clock tick
    compiled in after each layer; ONNX Runtime: one session per layer, run in model order).

    ``idle_ms``: sleep this long before each PyTorch pass, as a split's partition waits on its
    link between requests. Back to back (0), a pass finds the machine warm: its cores awake,
    its caches holding the weights. After idle it often is not (cores and caches given to other
    work, clocks lowered): here a pass after 100 ms idle took x1.15 (ResNet-18) to x2.7
    (BERT-mini) the back-to-back time, with two threads. Profile with the idle a deployment's
    requests see.

    ``device``: the torch device the PyTorch timings compute on (None: the CPU). ONNX Runtime
    is timed on the CPU only: on an accelerator it is left out."""
    if idle_ms < 0:
        raise ConfigError(f"idle_ms must be at least 0, not {idle_ms}")
    device = device or _CPU
    onnx = onnx and onnx_available() and device.type == "cpu"
    values = record_tensors(graph)
    inputs = {name: values[name] for name in graph.inputs}
    # no_grad, not inference_mode: the mode the runtime runs partitions in (TorchBackend), so
    # that a profile predicts requests (inference mode is a few per cent faster)
    with torch.no_grad():
        eager, whole_eager = _eager_in_context(graph, warmup, repeats, progress, idle_ms,
                                               device)
        whole = {"eager_ms": whole_eager, "onnx_ms": None}
        onnx_rows: Sequence[dict[str, float] | None] = [None] * len(graph.layers)
        if onnx:
            parts = [extract_partition(graph, [layer.name]) for layer in graph.layers]
            steps = _onnx_steps(parts, values, progress)
            if steps is not None:
                np_inputs = {k: v.numpy() for k, v in inputs.items()}
                onnx_rows = _in_context(steps, np_inputs, warmup, repeats, progress,
                                        "timing ONNX Runtime")
            whole["onnx_ms"] = _time_whole_onnx(graph, values, warmup, repeats)
    rows = []
    for layer, eager_ms, onnx_ms in zip(graph.layers, eager, onnx_rows, strict=True):
        row = LayerWork.of(graph, layer).to_dict()
        row.update(op=layer.op, eager_ms=eager_ms, onnx_ms=onnx_ms)
        rows.append(row)
    return {
        "version": PROFILE_VERSION,
        "kind": "edgesplit-profile",
        "model": graph.model,
        "input_shapes": [list(t.shape) for t in graph.example_inputs],
        "machine": machine_info(device),
        "warmup": warmup,
        "repeats": repeats,
        "idle_ms": idle_ms,
        "layers": rows,
        "whole_model": whole,
        "sum_of_layers_ms": {
            "eager": sum(r["eager_ms"]["median"] for r in rows),
            "onnx": sum(r["onnx_ms"]["median"] for r in rows) if all(r["onnx_ms"] for r in rows)
            else None,
        },
    }


def _time_whole_onnx(graph: LayerGraph, values: dict, warmup: int, repeats: int
                     ) -> dict[str, float] | None:
    whole = extract_partition(graph, [layer.name for layer in graph.layers])
    args = tuple(values[n] for n in whole.inputs)
    try:
        session, names = _onnx_session(whole, args)
    except Exception:
        return None
    feeds = {name: a.numpy() for name, a in zip(names, args, strict=False)}
    return time_call(lambda: session.run(None, feeds), warmup=warmup, repeats=repeats)


def save_profile(profile: dict[str, Any], path: str | Path) -> None:
    Path(path).write_text(json.dumps(profile, indent=2) + "\n")


def load_profile(path: str | Path) -> dict[str, Any]:
    """Read a profile file; unknown versions and malformed files raise ConfigError."""
    path = Path(path)
    try:
        doc = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(f"cannot read profile {str(path)!r}: {exc}") from None
    if not isinstance(doc, dict) or doc.get("kind") != "edgesplit-profile":
        raise ConfigError(f"{str(path)!r} is not an edgesplit profile (write one with "
                          "`edgesplit profile MODEL --out FILE`)")
    if doc.get("version") != PROFILE_VERSION:
        raise ConfigError(f"profile {str(path)!r} has version {doc.get('version')!r}; this "
                          f"edgesplit reads version {PROFILE_VERSION}")
    return doc


def works_and_latencies(profile: Mapping[str, Any], backend: str = "eager"
                        ) -> tuple[list[LayerWork], list[float]]:
    """Training data for :class:`RegressionEstimator` from a profile."""
    fields = LayerWork.__dataclass_fields__
    works, latencies = [], []
    for row in profile["layers"]:
        timing = row.get(f"{backend}_ms")
        if timing:
            works.append(LayerWork(**{k: row[k] for k in fields if k in row}))
            latencies.append(timing["median"])
    return works, latencies


def prefix_partitions(graph: LayerGraph, count: int) -> list[list[str]]:
    """Up to ``count`` edge parts ending at evenly spaced single-tensor cuts (not the ends)."""
    cuts = [c for c in graph.single_tensor_cuts() if 0 <= c.index < len(graph) - 1]
    if not cuts:
        return []
    step = max(1, len(cuts) // count)
    return [[layer.name for layer in graph.layers[: c.index + 1]] for c in cuts[::step][:count]]


def measure_partitions(graph: LayerGraph, parts: Sequence[Sequence[str]], *, warmup: int = 3,
                       repeats: int = 20) -> list[float]:
    """Median latency of running each set of layers as one partition. Runs go round-robin over
    the partitions so that all of them see the same machine conditions."""
    values = record_tensors(graph)
    calls = []
    for layers in parts:
        part = extract_partition(graph, layers)
        args = tuple(values[n] for n in part.inputs)
        calls.append(lambda part=part, args=args: part(*args))
    samples: list[list[float]] = [[] for _ in calls]
    with torch.no_grad():  # as the runtime runs them (see profile_graph)
        for run in range(warmup + repeats):
            for i, call in enumerate(calls):
                start = time.perf_counter_ns()
                call()
                if run >= warmup:
                    samples[i].append((time.perf_counter_ns() - start) / 1e6)
    return [statistics.median(s) for s in samples]

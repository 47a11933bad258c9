"""A Plan made executable: one partition per device, what each receives and sends, at which
bits, in the plan's chain order.

``PlanProgram.load(plan)`` captures the plan's model again (its built-in name or ``.pt2`` and
input shapes), checks that the layers are the plan's, and extracts every device's layers as a
runnable :class:`~edgesplit.graph.Partition` taking exactly the tensors that cross into it.
Quantized plans run their edge layers with weights quantized at ``w_bits`` (per output channel,
as planned) and outputs rounded at ``a_bits`` (per tensor, over each tensor's own range: the
plan does not carry calibration ranges); tensors crossing a link travel at the transfer's bits
through the wire format.

Devices form a chain (the plan's device order): device 0 holds the model inputs, each later
device receives what its predecessor sends and forwards what later devices need; the model
outputs travel back along the chain to device 0.

A *star* plan (:func:`edgesplit.plan.star_layout`: SplitNets' V sensors and one aggregator)
runs as ``kind == "star"``: each source receives its own model inputs and sends its transfer
to the sink; the sink receives what every source sends and returns the model outputs, which
every source relays to its caller.

A *mesh* plan (:func:`edgesplit.plan.mesh_layout`, JMSNAS Fig. 2b) runs as ``kind == "mesh"``:
a chain up to the ``root``, which sends each branch (``sources``) the tensors it needs; the
branches send to the aggregator (``sink``), which joins them as a star's sink does and is
followed by a chain (``hops`` says where each device but the root sends). Every device answers
with the model outputs computed on it or after it. Other parallel plans are not executable.

*Compute emulation* (:meth:`PlanProgram.emulate`, ``serve``/``run --emulate-device``): a step
with an ``emulate_ms`` target sleeps after computing until its compute took what the plan
predicts for its device (``plan.predicted.compute_ms``), so a fast machine rehearses a slower
device preset end to end. It cannot speed a slower machine up: then it warns once and runs as
is. How long each call slept is reported per device (``<device>.emulated_ms``).
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch

from edgesplit.errors import ConfigError, GraphError, option
from edgesplit.graph import LayerGraph, capture
from edgesplit.graph.partition import Partition, extract_partition
from edgesplit.graph.user_model import is_code_ref
from edgesplit.hardware import accelerator
from edgesplit.plan.model import (
    MESH_SHAPE,
    MeshLayout,
    Plan,
    PlanDevice,
    StarLayout,
    mesh_layout,
    star_layout,
)
from edgesplit.quant.fakequant import fake_quantize, quantize_weight, set_tensor_attr
from edgesplit.quant.wire import PlainCodec
from edgesplit.runtime.backends import Backend, TorchBackend, get_backend

__all__ = ["DeviceStep", "PlanProgram", "dynamic_fake_quant", "plan_id"]

log = logging.getLogger(__name__)
_WARN_LOCK = threading.Lock()


def plan_id(plan: Plan) -> str:
    """A short, stable fingerprint of a plan: both ends must run the same one."""
    return hashlib.sha256(plan.model_dump_json().encode()).hexdigest()[:16]


def dynamic_fake_quant(x: torch.Tensor, bits: int) -> torch.Tensor:
    """Round ``x`` to ``bits`` over its own range, per sample (dimension 0), asymmetric: a
    sample's result never depends on what else shares its batch."""
    if not x.is_floating_point() or bits >= 32:
        return x
    dims = tuple(range(1, x.dim())) or None
    # tensors, not Python floats, so an ONNX export keeps the range a function of the input
    lo = x.amin(dim=dims, keepdim=True) if dims else x.amin()
    hi = x.amax(dim=dims, keepdim=True) if dims else x.amax()
    return fake_quantize(x, bits, lo, hi)


@dataclass
class DeviceStep:
    """One device's share of a plan."""

    index: int
    name: str
    partition: Partition | None  # None: the device only relays
    # tensors arriving from the previous device (device 0: inputs); in a star, a source's own
    # model inputs and, at the sink, everything the sources send
    receives: tuple[str, ...]
    sends: tuple[str, ...]  # tensors for the next device (in a star: the sink)
    send_bits: dict[str, int] = field(default_factory=dict)  # per tensor; absent: as computed
    returns: tuple[str, ...] = ()  # model outputs this device and those after it answer with

    session: object | None = None  # what a backend prepared (an ONNX Runtime session)
    backend: Backend = field(default_factory=TorchBackend)
    # compute emulation: each compute lasts at least this long (the plan's prediction for the
    # device); None: run at this machine's own speed
    emulate_ms: float | None = None
    _emulated: threading.local = field(default_factory=threading.local, repr=False)
    _warned: bool = field(default=False, repr=False)

    def compute(self, values: dict[str, torch.Tensor], state: Any = None
                ) -> dict[str, torch.Tensor]:
        """Run the partition on ``values`` (by name); returns ``values`` plus its outputs.
        ``state``: this client session's backend state (see :mod:`edgesplit.runtime.backends`).
        With ``emulate_ms`` set, sleeps until the call has lasted that long."""
        if self.partition is None:
            return dict(values)
        missing = [t for t in self.partition.inputs if t not in values]
        if missing:
            raise ConfigError(f"device {self.name!r} needs tensor(s) {missing} it did not get")
        start = time.perf_counter()
        out = {**values, **self.backend.run(self, values, state)}
        if self.emulate_ms is not None:
            self._emulated.ms = self._emulate(start)
        return out

    def _emulate(self, start: float) -> float:
        """Sleep what is left of ``emulate_ms`` since ``start``; returns the milliseconds slept
        (noted per thread: the caller of :meth:`compute` reports its own call's with
        :meth:`take_emulated_ms`)."""
        assert self.emulate_ms is not None
        measured_ms = (time.perf_counter() - start) * 1e3
        left_s = (self.emulate_ms - measured_ms) / 1e3
        if left_s <= 0:
            with _WARN_LOCK:  # once per step (server threads race): every request would repeat it
                warn, self._warned = not self._warned, True
            if warn:
                log.warning("device %r computed in %.2f ms, slower than the plan's %.2f ms for "
                            "it: emulation cannot speed this machine up, it runs as is",
                            self.name, measured_ms, self.emulate_ms)
            return 0.0
        slept = time.perf_counter()
        time.sleep(left_s)
        return (time.perf_counter() - slept) * 1e3

    def take_emulated_ms(self) -> float:
        """Milliseconds this thread's last :meth:`compute` slept emulating (0 without emulation,
        and once taken)."""
        done = getattr(self._emulated, "ms", 0.0)
        self._emulated.ms = 0.0
        return done

    def emulation_timings(self) -> dict[str, float]:
        """``{"<device>.emulated_ms": ms}`` of this thread's last compute when emulating (what a
        server adds to its reply's timings), else nothing."""
        if self.emulate_ms is None:
            return {}
        return {f"{self.name}.emulated_ms": self.take_emulated_ms()}

    def to_onnx(self, example: dict[str, torch.Tensor]) -> bytes:
        """The partition as an ONNX model whose inputs and outputs are named by tensor."""
        import io
        import warnings

        assert self.partition is not None
        buffer = io.BytesIO()
        args = tuple(example[t] for t in self.partition.inputs)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            # the TorchScript exporter: milliseconds per layer (dynamo's takes seconds); torch
            # annotates f as a path, but this exporter writes to a binary file object as well
            torch.onnx.export(self.partition.module, args,
                              buffer,  # type: ignore[arg-type]  # a BytesIO, see above
                              dynamo=False, input_names=list(self.partition.inputs),
                              output_names=list(self.partition.outputs))
        return buffer.getvalue()


def _capture_for(plan: Plan, trust_model_file: bool = False) -> LayerGraph:
    source = plan.model.local_source
    optimize = plan.model.graph == "optimized"
    shapes = plan.model.input_shapes
    if str(source).endswith(".pt2"):
        if not Path(source).is_file():
            raise ConfigError(f"the plan's model file {source!r} is not here: copy the .pt2 "
                              f"there ({plan.model.source!r} in the plan, a path relative to "
                              "the plan file)")
        # the shape planned at: the file's own, or one its dynamic dimensions allow
        return capture(source, input_shape=shapes[0] if len(shapes) == 1 else None,
                       optimize=optimize, trust_model_file=trust_model_file)
    if is_code_ref(source) and not trust_model_file:
        # the user who typed `plan my_net.py:MyNet` ran their own code; whoever serves the
        # plan file may not have written it, and importing the module runs it
        raise ConfigError(f"the plan's model is Python code ({source}): loading it imports and "
                          f"runs that file; pass {option('trust_model_file', True)} if you "
                          "trust the plan and the code it names")
    shape = shapes[0] if shapes else None
    return capture(source, input_shape=shape, optimize=optimize)


def _chain(plan: Plan) -> list[str]:
    if plan.llm is not None:  # its layers are blocks with KV caches, not a captured graph
        raise ConfigError("this plan splits a causal LM into stages: serve its devices with "
                          "`edgesplit llm serve` and generate with `edgesplit llm generate` "
                          "(in Python: edgesplit.llm.llm_stage_server, "
                          "edgesplit.llm.LLMClient)")
    if not plan.runnable:
        why = str(_why_not_mesh(plan))
        raise ConfigError(f"this plan runs {', '.join(plan.parallel_devices)} in parallel (a "
                          "mesh): a prediction only, the runtime executes chains, stars and "
                          f"meshes of one shape ({MESH_SHAPE}), and {why}. Plan with the "
                          "best_chain method (the best chain through the mesh), a chain "
                          "topology, or edge/cloud")
    order = [d.name for d in plan.devices]
    for t in plan.transfers:
        if not t.tensors:
            continue
        i, j = order.index(t.src), order.index(t.dst)
        if abs(i - j) != 1:
            raise ConfigError(f"transfer {t.src}->{t.dst} skips devices; the runtime executes "
                              "chains where each device talks to the next")
    return order


def _why_not_mesh(plan: Plan) -> str:
    try:
        mesh_layout(plan)
    except ConfigError as exc:
        return str(exc).rpartition("): ")[2]
    return "it is one"


def _mesh_steps(plan: Plan, graph: LayerGraph, layout: MeshLayout) -> list[DeviceStep]:
    """Each device receives what the plan's transfers bring it (the first device: the model
    inputs) and sends what they take from it (the root: every branch's share); the serial
    devices answer with the model outputs computed on them or after them, a branch with the
    aggregator's."""
    sent = [t for t in plan.transfers if t.tensors and t.src != t.dst]
    steps = []
    for i, device in enumerate(plan.devices):
        arriving = [n for t in sent if t.dst == device.name for n in t.tensors]
        leaving = [n for t in sent if t.src == device.name for n in t.tensors]
        bits = {n: b for t in sent if t.src == device.name for n, b in t.bits.items()}
        steps.append(DeviceStep(i, device.name, _partition(graph, plan, device),
                                tuple(graph.inputs) if i == 0 else tuple(dict.fromkeys(arriving)),
                                tuple(dict.fromkeys(leaving)), bits))
    by_name = {s.name: s for s in steps}
    later: list[str] = []
    for name in reversed([*layout.head, layout.aggregator, *layout.tail]):
        partition = by_name[name].partition
        own = [t for t in graph.outputs if partition is not None and t in partition.outputs]
        later = own + [t for t in later if t not in own]
        by_name[name].returns = tuple(t for t in graph.outputs if t in later)
    for name in layout.branches:
        by_name[name].returns = by_name[layout.aggregator].returns
    return steps


def _partition(graph: LayerGraph, plan: Plan, device: PlanDevice) -> Partition | None:
    """The device's layers as a runnable module, quantized as planned (None: no layers)."""
    if not device.layers:
        return None
    partition = extract_partition(graph, device.layers)
    _quantize(partition, graph, plan)
    return partition


def _chain_steps(plan: Plan, graph: LayerGraph, order: list[str]) -> list[DeviceStep]:
    sends = {t.src: t for t in plan.transfers if order.index(t.dst) == order.index(t.src) + 1}
    steps, arriving = [], tuple(graph.inputs)
    for i, name in enumerate(order):
        device = next(d for d in plan.devices if d.name == name)
        out = sends.get(name)
        steps.append(DeviceStep(i, name, _partition(graph, plan, device), arriving,
                                tuple(out.tensors) if out else (),
                                dict(out.bits) if out else {}))
        arriving = tuple(out.tensors) if out else ()
    return steps


def _star_steps(plan: Plan, graph: LayerGraph, layout: StarLayout) -> list[DeviceStep]:
    """Sources receive their own model inputs and send their transfer to the sink; the sink
    receives every source's transfer; all of them answer with every model output (a source
    relays the sink's answer)."""
    sends = {t.src: t for t in plan.transfers if t.tensors and t.dst == layout.sink}
    gathered = tuple(t for s in layout.sources for t in sends[s].tensors)
    steps = []
    for i, device in enumerate(plan.devices):
        partition = _partition(graph, plan, device)
        if device.name == layout.sink:
            steps.append(DeviceStep(i, device.name, partition, gathered, (), {},
                                    returns=tuple(graph.outputs)))
            continue
        out = sends[device.name]
        own = tuple(x for x in graph.inputs if x in layout.inputs[device.name])
        steps.append(DeviceStep(i, device.name, partition, own, tuple(out.tensors),
                                dict(out.bits), returns=tuple(graph.outputs)))
    return steps


def _quantize(partition: Partition, graph: LayerGraph, plan: Plan) -> None:
    """Quantize a partition's weights and outputs in place, at the plan's per-layer bits."""
    bits = {layer.name: layer for layer in plan.layers}
    nodes = {n.name: n for n in partition.module.graph.nodes}
    for name in partition.layers:
        planned = bits[name]
        if planned.w_bits is not None and planned.w_bits < 32:
            tensors = dict(partition.module.named_parameters()) | \
                dict(partition.module.named_buffers())
            for target in graph.layer(name).param_names:
                value = tensors.get(target)
                if value is not None and value.is_floating_point() and value.dim() >= 2:
                    set_tensor_attr(partition.module, target,
                                    quantize_weight(value.detach(), planned.w_bits))
        if planned.a_bits is not None and planned.a_bits < 32:
            for tensor in graph.layer(name).outputs:
                node = nodes.get(tensor)
                if node is None:
                    continue
                g = partition.module.graph
                with g.inserting_after(node):
                    q = g.call_function(dynamic_fake_quant, (node, planned.a_bits))
                node.replace_all_uses_with(q, delete_user_cb=lambda u, q=q: u is not q)
    partition.module.graph.lint()
    partition.module.recompile()


@dataclass
class PlanProgram:
    """A plan's steps, one per device in the plan's order. ``kind``: ``chain`` (each device
    talks to the next), ``star`` (``sources`` each send to ``sink``) or ``mesh`` (``root``
    sends to every branch in ``sources``, which send to ``sink``; ``hops``: where every other
    device sends)."""

    plan: Plan
    graph: LayerGraph
    steps: list[DeviceStep]
    plan_id: str
    kind: Literal["chain", "star", "mesh"] = "chain"
    sources: tuple[str, ...] = ()  # a star's source devices (a mesh's branches), in plan order
    sink: str | None = None  # a star's sink device (a mesh's aggregator)
    root: str | None = None  # a mesh's root, which sends to every branch
    # a mesh: where each device but the root sends
    hops: dict[str, str] = field(default_factory=dict)
    # the wire codec of each tensor encoded or decoded so far, by name (see codec)
    _codecs: dict[str, PlainCodec] = field(default_factory=dict, init=False, repr=False,
                                           compare=False)

    @classmethod
    def load(cls, plan: Plan, graph: LayerGraph | None = None, *, backend: str = "torch",
             trust_model_file: bool = False, torch_device: str | torch.device | None = None
             ) -> PlanProgram:
        """``backend``: ``torch`` (the captured program), ``torchscript`` (the same, a
        partition called again with the same shapes run as a checked TorchScript trace) or
        ``onnxruntime`` (each partition exported to ONNX and run by ONNX Runtime).
        ``torch_device``: where the partitions compute (``cpu``, ``cuda[:N]``, ``mps``; the
        wire's tensors stay on the CPU). ``trust_model_file`` lets the plan's ``.pt2`` run the
        pickled code it may hold (a plan names any file: see
        :func:`edgesplit.graph.load_program`)."""
        # an unknown backend or a missing accelerator fails before the capture
        runner = get_backend(backend, accelerator.torch_device(torch_device))
        layout = star_layout(plan) if plan.shape == "star" else None
        mesh = mesh_layout(plan) if plan.shape == "mesh" and plan.runnable else None
        order = _chain(plan) if layout is None and mesh is None else []
        graph = graph or _capture_for(plan, trust_model_file)
        if [layer.name for layer in graph.layers] != [layer.name for layer in plan.layers]:
            raise ConfigError(f"the plan's layers do not match {graph.model} as captured here "
                              "(different edgesplit or model version?): plan it again")
        if mesh is not None:
            program = cls(plan, graph, _mesh_steps(plan, graph, mesh), plan_id(plan), "mesh",
                          mesh.branches, mesh.aggregator, mesh.root, mesh.next_of())
        elif layout is None:
            program = cls(plan, graph, _chain_steps(plan, graph, order), plan_id(plan))
            program._assign_returns()
        else:
            program = cls(plan, graph, _star_steps(plan, graph, layout), plan_id(plan), "star",
                          layout.sources, layout.sink)
        program._check_flow()
        program.use_backend(runner)
        return program

    def example_values(self) -> dict[str, torch.Tensor]:
        """Every tensor of one run on the example inputs (shapes for exports)."""
        from edgesplit.graph.partition import record_tensors

        return record_tensors(self.graph, *self.graph.example_inputs)

    def export_onnx(self) -> dict[str, bytes]:
        """One ONNX model per device that computes something, by device name."""
        values = self.example_values()
        return {s.name: s.to_onnx(values) for s in self.steps if s.partition is not None}

    def emulate(self, devices: Sequence[str] | None = None) -> dict[str, float]:
        """Compute emulation: make each step of ``devices`` (None: every computing step) last
        what the plan predicts for its device (``plan.predicted.compute_ms``); returns the
        targets by device. A request's compute then follows the plan's prediction wherever this
        machine is faster than the device it was planned for."""
        names = [s.name for s in self.steps] if devices is None else list(devices)
        targets = {}
        for name in names:
            step = self.step(name)
            if step.partition is None:
                continue
            predicted = self.plan.predicted.compute_ms.get(name)
            if predicted is None:
                raise ConfigError(f"the plan predicts no compute for device {name!r}: it cannot "
                                  "be emulated (plan it again)")
            step.emulate_ms = predicted
            targets[name] = predicted
        return targets

    def use_backend(self, backend: Backend) -> None:
        """Run every computing step with ``backend`` (prepared here, once)."""
        example = self.example_values() if not isinstance(backend, TorchBackend) else {}
        for step in self.steps:
            if step.partition is not None:
                backend.prepare(step, example)
            step.backend = backend

    def manifest(self) -> dict:
        """What an export writes next to the ONNX files: who receives and sends what."""
        star = {"sources": list(self.sources), "sink": self.sink} if self.kind == "star" else {}
        if self.kind == "mesh":
            star = {"root": self.root, "branches": list(self.sources), "aggregator": self.sink}
        return {"version": 1, "plan_id": self.plan_id, "model": self.graph.model,
                "kind": self.kind, **star,
                "devices": [{"name": s.name, "onnx": f"{s.name}.onnx" if s.partition else None,
                             "inputs": list(s.partition.inputs) if s.partition else [],
                             "outputs": list(s.partition.outputs) if s.partition else [],
                             "receives": list(s.receives), "sends": list(s.sends),
                             "send_bits": s.send_bits, "returns": list(s.returns)}
                            for s in self.steps]}

    def _assign_returns(self) -> None:
        """Each device answers with the model outputs computed on it or after it."""
        later: list[str] = []
        for step in reversed(self.steps):
            own = [t for t in self.graph.outputs
                   if step.partition is not None and t in step.partition.outputs]
            later = own + [t for t in later if t not in own]
            step.returns = tuple(t for t in self.graph.outputs if t in later)

    def _check_flow(self) -> None:
        available = set(self.graph.inputs)
        for step in self.steps:
            first = self.kind != "star" and step.index == 0  # a star's sources receive inputs
            have = set(step.receives) | (set(self.graph.inputs) if first else set())
            if step.partition is not None:
                missing = set(step.partition.inputs) - have
                if missing:
                    raise ConfigError(f"plan sends device {step.name!r} too little: it needs "
                                      f"{sorted(missing)}")
                have |= set(step.partition.outputs)
            available |= have
            if not set(step.sends) <= have:
                raise ConfigError(f"device {step.name!r} is to send "
                                  f"{sorted(set(step.sends) - have)} which it does not have")
            if self.kind == "star" and step.name == self.sink and not set(step.returns) <= have:
                raise ConfigError(f"the star's sink {step.name!r} lacks model outputs "
                                  f"{sorted(set(step.returns) - have)}")

    # ---- helpers used by the transport and by tests ------------------------------------------
    @property
    def outputs(self) -> list[str]:
        return list(self.graph.outputs)

    def step(self, device: str) -> DeviceStep:
        for s in self.steps:
            if s.name == device:
                return s
        raise ConfigError(f"device {device!r} is not in the plan; its devices are "
                          f"{', '.join(s.name for s in self.steps)}")

    def input_values(self, inputs: Sequence[torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
        xs = tuple(inputs) if inputs is not None else self.graph.example_inputs
        if len(xs) != len(self.graph.inputs):
            raise ConfigError(f"{self.graph.model} takes {len(self.graph.inputs)} input(s), got "
                              f"{len(xs)}")
        for name, x, ref in zip(self.graph.inputs, xs, self.graph.example_inputs, strict=True):
            if tuple(x.shape) != tuple(ref.shape) or x.dtype != ref.dtype:
                raise ConfigError(f"input {name!r} must be {tuple(ref.shape)} {ref.dtype}, got "
                                  f"{tuple(x.shape)} {x.dtype}")
        return dict(zip(self.graph.inputs, xs, strict=True))

    def encode(self, step: DeviceStep, values: Mapping[str, torch.Tensor],
               names: Sequence[str], default_bits: int = 32) -> dict[str, bytes]:
        return {t: self.codec(t).encode(values[t], step.send_bits.get(t, default_bits))
                for t in names}

    def decode(self, name: str, data: bytes | bytearray | memoryview) -> torch.Tensor:
        """Tensor ``name`` of the plan from its wire message, refusing (WireError) any other
        shape or dtype before its payload is decompressed or allocated (any contiguous
        bytes-like is read, not copied)."""
        return self.codec(name).decode(data)

    def codec(self, name: str) -> PlainCodec:
        """The wire codec of tensor ``name`` at its planned shape and dtype (made once: a
        served request encodes and decodes in its cold path right after compute)."""
        codec = self._codecs.get(name)
        if codec is None:
            info = self.graph.tensors[name]
            dtype = getattr(torch, info.dtype, None)
            if not isinstance(dtype, torch.dtype):
                raise ConfigError(f"the plan names an unknown dtype {info.dtype!r}")
            codec = self._codecs[name] = PlainCodec(info.shape, dtype)
        return codec

    def next_device(self, step: DeviceStep) -> str | None:
        """Where ``step`` sends: the next device of a chain, a star's sink (None: nowhere)."""
        if not step.sends or step.name == self.root:  # a mesh's root sends to every branch
            return None
        if self.kind == "mesh":
            return self.hops[step.name]
        return self.sink if self.kind == "star" else self.steps[step.index + 1].name

    def run_local(self, inputs: Sequence[torch.Tensor] | None = None
                  ) -> tuple[tuple[torch.Tensor, ...], dict[str, float]]:
        """The whole chain in this process, every hop through the wire format: the reference
        the networked run must equal, and the baseline of the overhead benchmark. A star runs
        its sources one after the other, then the sink."""
        if self.kind == "star":
            return self._run_star_local(inputs)
        if self.kind == "mesh":
            return self._run_mesh_local(inputs)
        timings = {"compute": 0.0, "serialize": 0.0}
        values = self.input_values(inputs)
        results: dict[str, torch.Tensor] = {}
        for step in self.steps:
            t0 = time.perf_counter()
            values = step.compute(values)
            t1 = time.perf_counter()
            results.update({t: values[t] for t in self.outputs if t in values})
            # the next device gets exactly what the plan sends, through the wire format, decoded
            # as its server decodes it
            values = {t: self.decode(t, b)
                      for t, b in self.encode(step, values, step.sends).items()}
            timings["compute"] += (t1 - t0) * 1e3
            timings["serialize"] += (time.perf_counter() - t1) * 1e3
        return tuple(results[t] for t in self.outputs), timings

    def _run_star_local(self, inputs: Sequence[torch.Tensor] | None
                        ) -> tuple[tuple[torch.Tensor, ...], dict[str, float]]:
        timings = {"compute": 0.0, "serialize": 0.0}
        values = self.input_values(inputs)
        arrived: dict[str, torch.Tensor] = {}
        for name in self.sources:
            step = self.step(name)
            t0 = time.perf_counter()
            out = step.compute({t: values[t] for t in step.receives})
            t1 = time.perf_counter()
            # the sink gets exactly what each source sends, through the wire format
            arrived.update({t: self.decode(t, b)
                            for t, b in self.encode(step, out, step.sends).items()})
            timings["compute"] += (t1 - t0) * 1e3
            timings["serialize"] += (time.perf_counter() - t1) * 1e3
        assert self.sink is not None  # a star has one
        t0 = time.perf_counter()
        result = self.step(self.sink).compute(arrived)
        timings["compute"] += (time.perf_counter() - t0) * 1e3
        return tuple(result[t] for t in self.outputs), timings

    def _run_mesh_local(self, inputs: Sequence[torch.Tensor] | None
                        ) -> tuple[tuple[torch.Tensor, ...], dict[str, float]]:
        """The head, the branches one after the other, the aggregator, the tail: each device
        gets what it receives through the wire format."""
        timings = {"compute": 0.0, "serialize": 0.0}
        inbox: dict[str, dict[str, torch.Tensor]] = {s.name: {} for s in self.steps}
        inbox[self.steps[0].name] = self.input_values(inputs)
        results: dict[str, torch.Tensor] = {}
        for step in self._mesh_order():
            t0 = time.perf_counter()
            values = step.compute(dict(inbox[step.name]))
            t1 = time.perf_counter()
            results.update({t: values[t] for t in self.outputs if t in values})
            targets = self.sources if step.name == self.root else \
                ((self.hops[step.name],) if step.name in self.hops else ())
            for target in targets:
                names = [t for t in self.step(target).receives if t in step.sends]
                inbox[target].update({t: self.decode(t, b) for t, b in
                                      self.encode(step, values, names).items()})
            timings["compute"] += (t1 - t0) * 1e3
            timings["serialize"] += (time.perf_counter() - t1) * 1e3
        return tuple(results[t] for t in self.outputs), timings

    def _mesh_order(self) -> list[DeviceStep]:
        """A mesh's steps in the order data flows: the head to the root, the branches, the
        aggregator and the tail (idle devices left out)."""
        order, name = [], self.steps[0].name
        while True:
            order.append(self.step(name))
            if name == self.root:
                order += [self.step(b) for b in self.sources]
                name = str(self.sink)
                continue
            if name not in self.hops:
                return order
            name = self.hops[name]

    def unsplit(self, inputs: Sequence[torch.Tensor] | None = None) -> tuple[torch.Tensor, ...]:
        """The float model on the same inputs, as the flat tensors of :attr:`outputs` (what a
        split run returns; :meth:`structured` rebuilds the model's own output from them)."""
        xs = tuple(self.input_values(inputs).values())
        if self.graph.program is None:  # load() extracts partitions, so it has one
            raise GraphError("this LayerGraph has no program to run (capture it again)")
        with torch.no_grad():
            out = self.graph.program(*xs)
        return self.graph.flat_outputs(out)

    def structured(self, outputs: Sequence[torch.Tensor]) -> Any:
        """The model's output as the model returns it (a dict, a tuple, a nested structure,
        None and constant leaves included) from the flat tensors of :attr:`outputs`, e.g.
        ``program.structured(client.request(x).outputs)``."""
        return self.graph.structured_outputs(tuple(outputs))

"""The Plan: the versioned JSON contract between planning and running.

A plan says which device runs which layers, which tensors cross which link (shapes, bytes,
bits), the predicted latency broken down per device and per link, and the edge memory. It also
carries the per-layer latency on every candidate device and the per-tensor sizes, so anyone can
re-check the prediction (:func:`recompute_total`) and the runtime can execute it.
"""

from __future__ import annotations

import itertools
import json
import os
from pathlib import Path
from typing import Any, Literal, NamedTuple

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, model_validator

from edgesplit.errors import ConfigError
from edgesplit.graph import INPUT, OUTPUT
from edgesplit.hardware import Device, Link
from edgesplit.validation import build

__all__ = [
    "PLAN_VERSION",
    "LLMBlock",
    "LLMHop",
    "LLMPlan",
    "LLMStage",
    "MeshLayout",
    "ModelRef",
    "Plan",
    "PlanAlternative",
    "PlanDevice",
    "PlanLayer",
    "PlanLink",
    "PlanQuality",
    "PlanShape",
    "PlanTensor",
    "Prediction",
    "StarLayout",
    "Transfer",
    "load_plan",
    "mesh_layout",
    "recompute_total",
    "star_layout",
]

PLAN_VERSION = 1
_STRICT = ConfigDict(frozen=True, extra="forbid")

# chain: devices in order, each talking to the next; star: sources (parallel_devices) each
# sending to one sink; mesh: any other parallel plan (executed when it has the shape of
# :func:`mesh_layout`, else a prediction only)
PlanShape = Literal["chain", "star", "mesh"]


class ModelRef(BaseModel):
    """Enough to capture the same program again: a built-in name or a .pt2 path, the input
    shapes, and whether the plan refers to the optimised or the raw layer graph, or (``blocks``)
    to a causal LM's blocks (``Plan.llm``; ``source`` is then a causal LM name or config)."""

    model_config = _STRICT
    name: str
    # a built-in name, or a path (.pt2, checkpoint folder, .gguf): a saved plan holds a path
    # given relative as relative to the plan file (``./`` or ``../``), so plan and weights
    # move together and run from any folder (:attr:`local_source` opens it)
    source: str
    input_shapes: list[list[int]]
    graph: Literal["optimized", "raw", "blocks"] = "optimized"
    # the folder of the plan file this was read from; not part of the plan (nor its id), as
    # each device may keep its copy somewhere else
    _plan_dir: Path | None = PrivateAttr(None)

    def __eq__(self, other: object) -> bool:
        # the same plan wherever its file lies, as for plan_id (pydantic would compare
        # _plan_dir too)
        if not isinstance(other, ModelRef):
            return NotImplemented
        return self.model_dump() == other.model_dump()

    def __hash__(self) -> int:
        return hash(self.model_dump_json())

    @property
    def local_source(self) -> str:
        """``source`` as this process opens it: a path relative to the plan file resolved
        against the folder :func:`load_plan` read it from; a name or an absolute path as is."""
        return _resolve_source(self.source, self._plan_dir)


def _plan_relative(source: str) -> bool:
    return source.startswith(("./", "../", ".\\", "..\\"))


def _code_file(source: str) -> tuple[str, str]:
    """A code reference's file and its ``:Name`` (``my_net.py:MyNet``: the file is a path like
    any other); anything else whole, with an empty name."""
    file, sep, name = source.rpartition(":")
    return (file, sep + name) if sep and file.endswith(".py") else (source, "")


def _resolve_source(source: str, plan_dir: Path | None) -> str:
    file, name = _code_file(source)
    return _resolve_path(file, plan_dir) + name


def _resolve_path(source: str, plan_dir: Path | None) -> str:
    path = Path(source)
    if plan_dir is None or path.is_absolute():
        return source
    beside = str(plan_dir / path)
    if _plan_relative(source):
        # a plan written before paths were relative to it may hold a ./ the user typed
        return source if path.exists() and not Path(beside).exists() else beside
    # a name, or a path relative to the folder an older plan was made in (tried first, as
    # it always was), else beside the plan
    return beside if not path.exists() and Path(beside).exists() else source


def _source_for(model: ModelRef, folder: Path) -> str:
    """``model``'s source as a plan file in ``folder`` stores it: a local path given relative
    becomes relative to that folder (a code reference's file too); a name or an absolute
    path is kept."""
    source, name = _code_file(model.source)
    if Path(source).is_absolute():
        return model.source
    local = Path(_code_file(model.local_source)[0])
    if not local.exists():  # a built-in name (or a file that is not here: left as given)
        return model.source
    try:
        rel = Path(os.path.relpath(local.resolve(), folder.resolve())).as_posix()
    except ValueError:  # another drive (Windows): no relative path exists
        return str(local.resolve()) + name
    return (rel if rel.startswith("../") else f"./{rel}") + name


class PlanDevice(BaseModel):
    model_config = _STRICT
    name: str
    role: Literal["edge", "cloud", "hop"]
    device: Device
    layers: list[str]
    compute_ms: float


class PlanLink(BaseModel):
    model_config = _STRICT
    src: str
    dst: str
    link: Link


class PlanTensor(BaseModel):
    model_config = _STRICT
    name: str
    producer: str
    consumers: list[str]
    shape: list[int]
    dtype: str
    bytes: int


class PlanLayer(BaseModel):
    """A layer with its latency on every candidate device (to re-check any placement)."""

    model_config = _STRICT
    name: str
    latency_ms: dict[str, float]
    param_bytes: int
    w_bits: int | None = None
    a_bits: int | None = None


class Transfer(BaseModel):
    """Tensors sent over one link in one direction. ``ms`` is the time on the wire (bytes /
    bandwidth); ``latency_ms`` the link's one-way latency (half its RTT) when anything is sent;
    ``serialize_ms`` the CPU time of encoding the tensors on ``src`` and decoding them on
    ``dst`` in the wire format (0 in plans written before it was priced; see
    docs/cost-model.md)."""

    model_config = _STRICT
    src: str
    dst: str
    tensors: list[str]
    bits: dict[str, int] = Field(default_factory=dict)  # per tensor, when sent quantized
    bytes: int
    ms: float
    latency_ms: float = 0.0
    serialize_ms: float = 0.0


class Prediction(BaseModel):
    """The predicted latency along the critical path: ``transfer_ms`` sums the transfers' time
    on the wire, ``rtt_ms`` their one-way latencies, ``serialize_ms`` their encode + decode
    (parallel devices: the slowest branch's). ``total_ms`` is compute + the three."""

    model_config = _STRICT
    compute_ms: dict[str, float]
    transfer_ms: float
    rtt_ms: float
    total_ms: float
    serialize_ms: float = 0.0  # absent from plans written before it was priced: 0


class PlanQuality(BaseModel):
    """The plan's measured quality on held-out data (AUTO-SPLIT's accuracy drop)."""

    model_config = _STRICT
    metric: Literal["top1", "cosine"]  # accuracy, or cosine similarity to float outputs (%)
    value: float
    reference: float  # the float model on the same samples
    drop: float  # reference - value, percentage points
    samples: int
    data: str


class PlanAlternative(BaseModel):
    """Another solution the planner weighed (AUTO-SPLIT's candidate list): enough to compare
    and to ask for it again (``split`` edge layers of the topological order at these bits)."""

    model_config = _STRICT
    split: int
    split_after: str | None
    total_ms: float
    edge_memory_bytes: int
    sent_bytes: int
    distortion: float
    drop: float | None = None  # measured accuracy drop, percentage points; None: not measured
    pareto: bool = False  # on the latency / drop (or distortion) Pareto front
    chosen: bool = False  # the candidate the plan is
    w_bits: dict[str, int] = Field(default_factory=dict)
    a_bits: dict[str, int] = Field(default_factory=dict)
    cloud_bits: int = 32  # 16: the cloud part runs in FP16


class LLMBlock(BaseModel):
    """A causal LM block (``embed``, ``block.i``, ``head``): the transformers modules it runs
    and what it stores."""

    model_config = _STRICT
    name: str
    kind: Literal["embed", "decoder", "head"]
    modules: list[str]
    param_bytes: int
    kv_bytes_per_token: int = 0


class LLMStage(BaseModel):
    """One device's contiguous blocks ``[start, end)`` (none: it relays), its memory at the
    plan's sessions and max context, and its compute per prefill and per decode step."""

    model_config = _STRICT
    device: str
    blocks: list[str]
    start: int
    end: int
    weight_bytes: int
    kv_cache_bytes: int
    activation_bytes: int
    memory_bytes: int
    memory_limit_bytes: int | None
    prefill_ms: float
    decode_ms: float


class LLMHop(BaseModel):
    """Link ``src -> dst`` of the chain per step: what the prefill and a decode step send
    forward (token ids or a hidden state; 0 past the head) and the token sent back towards
    the first device; each ``*_ms`` is wire time + half the RTT + encode/decode."""

    model_config = _STRICT
    src: str
    dst: str
    tensor: str | None
    prefill_bytes: int
    prefill_ms: float
    decode_bytes: int
    decode_ms: float
    return_bytes: int
    return_ms: float


class LLMPlan(BaseModel):
    """The causal-LM part of a stage plan (``Plan.llm``): the model's shape and dtype, the
    workload it was planned for, its blocks, one stage per device in chain order, one hop per
    link, and the predicted TTFT, TPOT and tokens/s. The runtime builds each stage from
    ``blocks[start:end]`` (plus ``shared_modules``) and keeps its KV cache per session, sized
    for ``max_context``. The Plan's layers are the blocks and its latencies are one request's
    (prefill + (new_tokens - 1) decode steps), so ``recompute_total`` holds."""

    model_config = _STRICT
    architecture: str
    # the precision (llm.model.precision): float32 / float16 / bfloat16, or quantized weights
    # (q8_0, q4_0, q4_1) in groups of ``group_size``; ``dtype_bytes`` is the activations',
    # the KV cache's and the wire's width (float32 under quantized weights)
    dtype: str
    dtype_bytes: int
    # weights per quantization group (None: float weights); left out of a float plan's JSON,
    # which is then what it was before quantized plans existed
    group_size: int | None = Field(None, exclude_if=lambda value: value is None)
    # how a quantized stage computes (llm.planning.costs.LLMWorkload): float32 or int8 inputs
    # to its kernels, or int8 but the attention's q/k/v projection (mixed); left out where float
    # (every plan before it existed)
    activations: Literal["float", "int8", "mixed"] = Field(
        "float", exclude_if=lambda value: value == "float")
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    max_positions: int
    tied_embeddings: bool
    shared_modules: list[str]
    objective: Literal["latency", "throughput"]
    prompt_tokens: int
    new_tokens: int
    max_context: int
    sessions: int
    decode_cached_tokens: int  # the cache length TPOT is priced at (the generation's mean)
    # a real checkpoint's content fingerprint (``model.source`` names it): each stage loads its
    # blocks from it and refuses another; None: random weights built from the source's config
    fingerprint: str | None = None
    blocks: list[LLMBlock]
    stages: list[LLMStage]
    hops: list[LLMHop]
    ttft_ms: float
    tpot_ms: float
    request_ms: float
    period_ms: float  # the slowest stage of a decode step (a stream's bound)
    tokens_per_s: float  # one session
    pipeline_tokens_per_s: float  # a stream with enough sessions in flight

    def check(self, plan: Plan) -> None:
        """ValueError unless the stages tile the blocks in chain order and match the plan, and
        the max context is within the model's positions."""
        names = [b.name for b in self.blocks]
        if [layer.name for layer in plan.layers] != names:
            raise ValueError("an LLM plan's layers must be its blocks, in order")
        if [s.device for s in self.stages] != [d.name for d in plan.devices]:
            raise ValueError("an LLM plan has one stage per device, in chain order")
        start = 0
        for stage, device in zip(self.stages, plan.devices, strict=True):
            if stage.start != start or stage.end < stage.start or \
                    stage.blocks != names[stage.start:stage.end] or device.layers != stage.blocks:
                raise ValueError(f"stage {stage.device}: blocks [{stage.start}, {stage.end}) "
                                 "must continue the previous stage and be the device's layers")
            start = stage.end
        if start != len(names):
            raise ValueError("the LLM stages must cover every block")
        if len(self.hops) != len(self.stages) - 1:
            raise ValueError("an LLM plan has one hop per link of its chain")
        if not 1 <= self.max_context <= self.max_positions:
            raise ValueError(f"the LLM plan's max_context of {self.max_context} tokens is not "
                             f"within the model's {self.max_positions} positions "
                             "(max_position_embeddings): plan it again with --max-context "
                             f"{self.max_positions} or less")


class Plan(BaseModel):
    model_config = _STRICT

    version: int = PLAN_VERSION
    method: str
    model: ModelRef
    devices: list[PlanDevice]
    links: list[PlanLink]
    layers: list[PlanLayer]
    tensors: list[PlanTensor]
    transfers: list[Transfer]
    predicted: Prediction
    edge_memory_bytes: int
    # Devices that run side by side between a root and an aggregator (JMSNAS eq. 2): the total
    # counts only the slowest of them, with its incoming and outgoing transfers.
    parallel_devices: list[str] = Field(default_factory=list)
    feasible: bool = True
    reason: str | None = None  # why infeasible, or a note from the planner
    quality: PlanQuality | None = None  # measured on held-out data, when there was any
    alternatives: list[PlanAlternative] = Field(default_factory=list)
    # A causal LM's stages. Left out of a layer-graph plan's JSON, so those files (and their
    # fingerprints) are what they were before LLM plans existed.
    llm: LLMPlan | None = Field(None, exclude_if=lambda value: value is None)

    @model_validator(mode="after")
    def _consistent(self) -> Plan:
        if self.version != PLAN_VERSION:
            raise ValueError(f"plan version {self.version} is not supported (this edgesplit "
                             f"reads version {PLAN_VERSION})")
        placed = [n for d in self.devices for n in d.layers]
        names = [layer.name for layer in self.layers]
        if sorted(placed) != sorted(names):
            raise ValueError("every layer must be placed on exactly one device")
        devices = {d.name for d in self.devices}
        for t in self.transfers:
            if t.src not in devices or t.dst not in devices:
                raise ValueError(f"transfer {t.src}->{t.dst} names an unknown device")
        if self.llm is not None:
            self.llm.check(self)
        return self

    # ---- convenience -----------------------------------------------------------------------
    def device_of(self, layer: str) -> str:
        for d in self.devices:
            if layer in d.layers:
                return d.name
        raise KeyError(layer)

    @property
    def edge_layers(self) -> list[str]:
        return [n for d in self.devices if d.role == "edge" for n in d.layers]

    @property
    def sent_bytes(self) -> int:
        return sum(t.bytes for t in self.transfers if t.src != t.dst and t.tensors)

    @property
    def shape(self) -> PlanShape:
        """``chain`` (no parallel devices), ``star`` (see :func:`star_layout`) or ``mesh``
        (any other plan with parallel devices)."""
        if not self.parallel_devices:
            return "chain"
        return "star" if _star(self)[0] is not None else "mesh"

    @property
    def runnable(self) -> bool:
        """Whether ``edgesplit run`` can execute this plan: the runtime executes chains,
        stars and meshes of :func:`mesh_layout`'s shape; any other plan with parallel devices
        is a prediction only, and a causal LM's stage plan (``llm``) is for the LLM runtime,
        not this one."""
        if self.llm is not None:
            return False
        return self.shape != "mesh" or _mesh(self)[0] is not None

    def to_json(self) -> str:
        return self.model_dump_json(indent=2)

    def save(self, path: str | Path) -> None:
        """Write the plan to ``path``, its model's path relative to that file (see
        :class:`ModelRef`)."""
        path = Path(path)
        model = self.model.model_copy(update={"source": _source_for(self.model, path.parent)})
        path.write_text(self.model_copy(update={"model": model}).to_json() + "\n")


def recompute_total(plan: Plan) -> float:
    """The total latency recomputed from the plan's own per-layer and per-transfer numbers
    (parallel devices: only the slowest, with its transfers, counts)."""
    parallel = set(plan.parallel_devices)
    per_device = {d.name: 0.0 for d in plan.devices}
    for layer in plan.layers:
        device = plan.device_of(layer.name)
        per_device[device] += layer.latency_ms[device]
    serial = sum(ms for d, ms in per_device.items() if d not in parallel)
    branch = dict.fromkeys(parallel, 0.0)
    for t in plan.transfers:
        touched = {t.src, t.dst} & parallel
        if touched:
            branch[touched.pop()] += t.ms + t.latency_ms + t.serialize_ms
        else:
            serial += t.ms + t.latency_ms + t.serialize_ms
    for d in parallel:
        branch[d] += per_device[d]
    # Plans written before transfers carried their latency put it in predicted.rtt_ms alone.
    legacy_rtt = 0.0 if any(t.latency_ms for t in plan.transfers) else plan.predicted.rtt_ms
    return serial + max(branch.values(), default=0.0) + legacy_rtt


class StarLayout(NamedTuple):
    """A star plan's roles: ``inputs[source]`` are the model inputs born on each source."""

    sources: tuple[str, ...]
    sink: str
    inputs: dict[str, tuple[str, ...]]


def star_layout(plan: Plan) -> StarLayout:
    """The sources and sink of a star plan (SplitNets' multi-view fusion): every device but one
    runs in parallel (``parallel_devices``, the sources); each model input is born on one
    source; a source's layers read only its own inputs and layers; sources send only to the
    sink, which runs every other layer and holds every model output. Anything else raises
    ConfigError saying what breaks the shape."""
    layout, why = _star(plan)
    if layout is None:
        raise ConfigError(f"this plan is not a star: {why}")
    return layout


def _star(plan: Plan) -> tuple[StarLayout | None, str]:
    """(the layout, "") for a star plan, else (None, why not)."""
    sources = tuple(plan.parallel_devices)
    rest = [d.name for d in plan.devices if d.name not in sources]
    if len(rest) != 1 or len(rest) + len(set(sources)) != len(plan.devices):
        return None, (f"a star's devices are its parallel sources and one sink; {rest} are "
                      "not parallel")
    sink = rest[0]
    sent: dict[str, set[str]] = {s: set() for s in sources}
    for t in plan.transfers:
        if t.tensors and (t.src not in sources or t.dst != sink):
            return None, f"{t.src} sends to {t.dst}; a star's sources send only to its sink"
        if t.tensors:
            sent[t.src].update(t.tensors)
    where = {layer: d.name for d in plan.devices for layer in d.layers}
    inputs: dict[str, list[str]] = {s: [] for s in sources}
    for tensor in plan.tensors:
        readers = {sink if c == OUTPUT else where[c] for c in tensor.consumers}
        if tensor.producer == INPUT:
            homes = [s for s in sources if s in readers or tensor.name in sent[s]]
            if len(homes) != 1:
                return None, (f"model input {tensor.name!r} is used on {sorted(readers)}; a "
                              "star's input belongs to one source")
            inputs[homes[0]].append(tensor.name)
            home = homes[0]
        else:
            home = where[tensor.producer]
        strays = sorted(r for r in readers - {home}
                        if r != sink or tensor.name not in sent.get(home, ()))
        if strays:
            return None, f"{tensor.name!r} of {home} is read on {strays} without being sent there"
    idle = [s for s in sources if not inputs[s] or not sent[s]]
    if idle:
        return None, f"source(s) {idle} hold no model input or send nothing to {sink}"
    return StarLayout(sources, sink, {s: tuple(v) for s, v in inputs.items()}), ""


class MeshLayout(NamedTuple):
    """A runnable mesh plan's roles (JMSNAS Fig. 2b): ``head`` is the chain from the device
    holding the model inputs to the ``root`` (its last device), which broadcasts to the
    ``branches``; the ``aggregator`` joins them and ``tail`` is the chain after it. ``idle``:
    parallel devices that compute and receive nothing (the plan left them out)."""

    head: tuple[str, ...]
    branches: tuple[str, ...]
    aggregator: str
    tail: tuple[str, ...]
    idle: tuple[str, ...]

    @property
    def root(self) -> str:
        return self.head[-1]

    def next_of(self) -> dict[str, str]:
        """Where each device but the root sends (the root sends to every branch)."""
        serial = [*self.head, self.aggregator, *self.tail]
        nxt = {a: b for a, b in itertools.pairwise(serial) if a != self.root}
        return nxt | dict.fromkeys(self.branches, self.aggregator)


MESH_SHAPE = ("a chain of devices to one root, which sends to two or more parallel branch "
              "devices, each sending only to one aggregator, followed by a chain of devices")


def mesh_layout(plan: Plan) -> MeshLayout:
    """The roles of a mesh plan the runtime executes (see :class:`MeshLayout`): every transfer
    goes from one device to the next of the serial devices (in plan order), except that the
    root sends only to the branches (the parallel devices that receive anything) and each
    branch sends only to the aggregator. Anything else raises ConfigError saying what breaks
    the shape."""
    layout, why = _mesh(plan)
    if layout is None:
        raise ConfigError(f"this plan is not a mesh the runtime executes ({MESH_SHAPE}): {why}")
    return layout


def _mesh(plan: Plan) -> tuple[MeshLayout | None, str]:
    """(the layout, "") for a runnable mesh plan, else (None, why not)."""
    parallel = set(plan.parallel_devices)
    sent = [t for t in plan.transfers if t.tensors and t.src != t.dst]
    active = [d.name for d in plan.devices if d.name in parallel and
              (d.layers or any(d.name in (t.src, t.dst) for t in sent))]
    serial = [d.name for d in plan.devices if d.name not in parallel]
    roots = {t.src for t in sent if t.dst in parallel}
    aggregators = {t.dst for t in sent if t.src in parallel}
    if len(active) < 2 or len(roots) != 1 or len(aggregators) != 1:
        return None, (f"its parallel devices {active} receive from {sorted(roots)} and send to "
                      f"{sorted(aggregators)}")
    root, aggregator = roots.pop(), aggregators.pop()
    if plan.devices[0].name in parallel:
        return None, f"its first device {plan.devices[0].name!r} (the model inputs') is parallel"
    if root in parallel or aggregator in parallel or \
            serial.index(aggregator) != serial.index(root) + 1:
        return None, (f"the aggregator {aggregator!r} must be the serial device right after "
                      f"the root {root!r}")
    for t in sent:
        branch = (t.dst in active and t.src == root) or \
            (t.src in active and t.dst == aggregator)
        chained = t.src in serial and t.dst in serial and t.src != root and \
            serial.index(t.dst) == serial.index(t.src) + 1
        if not (branch or chained):
            return None, f"{t.src} sends to {t.dst}"
    lone = [b for b in active if not {(root, b), (b, aggregator)} <=
            {(t.src, t.dst) for t in sent}]
    if lone:
        return None, f"branch device(s) {lone} must receive from {root} and send to {aggregator}"
    cut = serial.index(root) + 1
    idle = tuple(d for d in plan.parallel_devices if d not in active)
    return MeshLayout(tuple(serial[:cut]), tuple(active), aggregator,
                      tuple(serial[cut + 1:]), idle), ""


def load_plan(path: str | Path) -> Plan:
    """Read a plan file; malformed files and unknown versions raise ConfigError. A model path
    in it is opened relative to the file (``plan.model.local_source``), or, for plans written
    before that, relative to the working folder when it is there."""
    try:
        data: Any = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(f"cannot read plan {str(path)!r}: {exc}") from None
    if isinstance(data, dict) and data.get("version") not in (None, PLAN_VERSION):
        raise ConfigError(f"plan {str(path)!r} has version {data.get('version')!r}; this "
                          f"edgesplit reads version {PLAN_VERSION}")
    plan = build(Plan, data, f"plan file {str(path)!r}")
    plan.model._plan_dir = Path(path).resolve().parent
    return plan

"""The cost tables of placing a causal LM's blocks on a chain of devices, for both phases.

The user sits at the chain's first device: the prompt is born there and every generated token
is delivered there, which is also where the next decode step starts (its embedding needs the
token). A stage is a contiguous range of blocks on one device; a device may hold none (it
relays what crosses it). So, with ``c`` the blocks done before link m (between devices m and
m+1), each step

- sends forward over link m what crosses after ``c`` blocks: token ids if ``c == 0``, the
  hidden state if ``0 < c < n``, nothing once the head has run;
- sends the picked token back over link m if the head runs beyond it (``c < n``).

Each send costs what every plan prices (docs/cost-model.md): the wire time of its bytes, half
the link's RTT, and the wire format's encode + decode on the two devices.

A request of N new tokens is one prefill (P prompt tokens, it yields the first token) and N-1
decode steps, so ``request = TTFT + (N-1) x TPOT``. A decode step is priced at the generation's
mean context, P + (N-2)/2 cached tokens: attention work is linear in the context, so N-1 of
these are the generation's total work.

Memory per device: its blocks' weights, ``sessions`` KV caches at ``max_context`` tokens, and
the largest prefill working set of its blocks (a device with no blocks: what it relays).
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Literal, get_args

import numpy as np

from edgesplit.errors import ConfigError, option
from edgesplit.hardware import Device, LatencyEstimator, Link, Topology, serialize_ms
from edgesplit.llm.model.description import TOKEN_BYTES, CausalLM, Phase
from edgesplit.llm.planning.calibration import MeasuredBlocks, llm_estimator_for, ops_ms
from edgesplit.plan.assemble import one_way_latency_ms

__all__ = ["Activations", "LLMChainCosts", "LLMWorkload", "Objective", "SendCost", "block_ms",
           "resolve_activations"]

Objective = Literal["latency", "throughput"]
Activations = Literal["float", "int8", "mixed"]
# the activations quantized weights compute with unless the workload says: int8 but the
# attention's q/k/v projection, ahead of llama.cpp at one thread and agreeing with float32 as
# often as llama.cpp does (benchmarks/results/llm_engines.md); float weights: their own width
DEFAULT_QUANTIZED_ACTIVATIONS: Activations = "mixed"


def resolve_activations(activations: Activations | Literal["auto"], quantized: bool
                        ) -> Activations:
    """``activations``, where ``auto`` is the default for weights that are (or are not)
    ``quantized``."""
    if activations != "auto":
        return activations
    return DEFAULT_QUANTIZED_ACTIVATIONS if quantized else "float"


@dataclass(frozen=True)
class LLMWorkload:
    """What the placement serves: prompts of ``prompt_tokens``, ``new_tokens`` generated per
    request, KV caches sized for ``max_context`` tokens (default: prompt + new) for
    ``sessions`` sessions at once, and the objective (``latency``: TTFT + (N-1) x TPOT of one
    request; ``throughput``: the slowest pipeline stage of a decode step). ``activations``:
    how quantized weights' stages compute (``float``: float32 inputs to the 4-bit kernels,
    closest to the float model; ``int8``: inputs quantized to int8 per block as llama.cpp
    does, fastest and batching best; ``mixed``: int8 but the attention's q/k/v projection,
    a little closer to the float model for ~5 % more time a step;
    :mod:`edgesplit.llm.stage.onnx_stage` has numbers). ``auto`` (the default): ``mixed``
    for quantized weights, ``float`` otherwise (:meth:`resolved`, as costs are built)."""

    prompt_tokens: int = 128
    new_tokens: int = 128
    max_context: int | None = None
    sessions: int = 1
    objective: Objective = "latency"
    activations: Activations | Literal["auto"] = "auto"

    def __post_init__(self) -> None:
        for name in ("prompt_tokens", "new_tokens", "sessions"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{option(name, getattr(self, name))} must be at least 1")
        if self.max_context is not None and self.max_context < self.prompt_tokens + self.new_tokens:
            raise ConfigError(f"{option('max_context', self.max_context)} must hold the prompt "
                              f"and the new tokens ({self.prompt_tokens} + {self.new_tokens})")
        if self.objective not in ("latency", "throughput"):
            raise ConfigError(f"{option('objective', self.objective)}: choose latency or "
                              "throughput")
        if self.activations not in (*get_args(Activations), "auto"):
            raise ConfigError(f"{option('activations', self.activations)}: choose "
                              f"{', '.join(get_args(Activations))} or auto")

    def resolved(self, quantized: bool) -> LLMWorkload:
        """This workload with ``auto`` activations made the default for weights that are
        (or are not) ``quantized``."""
        if self.activations != "auto":
            return self
        return replace(self, activations=resolve_activations("auto", quantized))

    @property
    def context(self) -> int:
        """Tokens each KV cache is sized for."""
        return self.max_context or self.prompt_tokens + self.new_tokens

    @property
    def decode_cached(self) -> int:
        """The cache length a decode step is priced at: the mean over the N-1 steps."""
        return self.prompt_tokens + max(self.new_tokens - 2, 0) // 2

    @property
    def decode_steps(self) -> int:
        return self.new_tokens - 1


@dataclass(frozen=True)
class SendCost:
    """One send over a link: bytes, wire time, one-way latency, encode + decode."""

    bytes: int
    wire_ms: float
    latency_ms: float
    serialize_ms: float

    @property
    def ms(self) -> float:
        return self.wire_ms + self.latency_ms + self.serialize_ms

    @property
    def occupancy_ms(self) -> float:
        """How long the send keeps the link and its ends busy: a stream overlaps the
        propagation delay of one step with the next, not the wire or the codec."""
        return self.wire_ms + self.serialize_ms

    @classmethod
    def of(cls, link: Link, src: Device, dst: Device, nbytes: int, *,
           direction: Literal["up", "down"] = "up") -> SendCost:
        if not nbytes:
            return cls(0, 0.0, 0.0, 0.0)
        return cls(nbytes, link.transfer_ms(nbytes, direction=direction),
                   one_way_latency_ms(link, True), serialize_ms(src, dst, nbytes))


def block_ms(lm: CausalLM, device: Device, phase: Phase,
             estimator: LatencyEstimator | None = None, *,
             activations: Activations | Literal["auto"] = "auto") -> list[float]:
    """Each block's time on ``device`` in ``phase``: measured block times where the estimator
    has them (:class:`~edgesplit.llm.planning.calibration.MeasuredBlocks`), else its kernels
    through the estimator at the LM's activation width. Default estimator:
    :func:`~edgesplit.llm.planning.calibration.llm_estimator_for` (``this-machine``'s measured
    blocks at ``activations`` when cached, the device's compute model's otherwise; ``auto``:
    the default for the LM's weights)."""
    activations = resolve_activations(activations, lm.weights.quantized)
    estimator = estimator or llm_estimator_for(lm, device, activations)
    if isinstance(estimator, MeasuredBlocks):
        return estimator.blocks_ms(lm, phase, device)
    return ops_ms(lm, device, phase, estimator)


@dataclass
class LLMChainCosts:
    """Per device and block the prefill and decode time; per link and cut the sends; per
    block range the memory. ``n`` blocks, ``M`` devices in chain order."""

    lm: CausalLM
    workload: LLMWorkload
    topology: Topology
    devices: list[str]
    prefill_ms: np.ndarray  # [M, n]
    decode_ms: np.ndarray  # [M, n]
    forward_prefill: list[list[SendCost]]  # [M-1][n+1]: link m, c blocks done before it
    forward_decode: list[list[SendCost]]  # [M-1][n+1]
    back: list[list[SendCost]]  # [M-1][n+1]: the token returning over link m
    memory_need: np.ndarray  # [n+1, n+1]: bytes of a device running blocks [a, b)
    weight_bytes: np.ndarray  # [n+1, n+1]
    kv_bytes: np.ndarray  # [n+1, n+1]: sessions x max_context tokens
    activation_bytes: np.ndarray  # [n+1, n+1]
    memory_limits: list[int | None]  # [M]

    @classmethod
    def build(cls, lm: CausalLM, topology: Topology, workload: LLMWorkload, *,
              estimators: Mapping[str, LatencyEstimator] | None = None) -> LLMChainCosts:
        if not topology.is_chain:
            raise ConfigError(f"topology {topology.name!r} is not a chain: LLM stages run in "
                              "a chain of devices (each talks to the next); pass a chain")
        if workload.context > lm.shape.max_positions:
            raise ConfigError(f"{option('max_context', workload.context)} exceeds the "
                              f"{lm.shape.max_positions} positions {lm.name} was built for; "
                              "plan a shorter context")
        _check_window(lm, workload)
        workload = workload.resolved(lm.weights.quantized)
        if workload.activations != "float" and not lm.weights.quantized:
            raise ConfigError(f"{workload.activations} activations need quantized weights "
                              f"(precision {lm.dtype} computes at its own width): plan with "
                              "--precision q8_0, q4_0, q4_1 or gguf, or leave --activations "
                              "out")
        order = topology.chain_order()
        devices = [topology.device(name) for name in order]
        prefill, decode = Phase.prefill(workload.prompt_tokens), Phase.decode(
            workload.decode_cached)

        # one estimator per device for both phases (a measured one loads and fits its profile)
        chosen = {d.name: (estimators or {}).get(d.name)
                  or llm_estimator_for(lm, d, workload.activations) for d in devices}

        n = lm.n
        links = [topology.link(a, b) for a, b in itertools.pairwise(order)]
        hops = list(zip(links, devices, devices[1:], strict=False))

        def sends(phase: Phase) -> list[list[SendCost]]:
            return [[SendCost.of(link, a, b, lm.boundary_bytes(c, phase)) for c in range(n + 1)]
                    for link, a, b in hops]

        back = [[SendCost.of(link, b, a, TOKEN_BYTES if c < n else 0, direction="down")
                 for c in range(n + 1)] for link, a, b in hops]
        weights, kv, act = _range_memory(lm, workload, prefill)
        return cls(lm, workload, topology, order,
                   np.array([block_ms(lm, d, prefill, chosen[d.name]) for d in devices]),
                   np.array([block_ms(lm, d, decode, chosen[d.name]) for d in devices]),
                   sends(prefill), sends(decode), back, weights + kv + act, weights, kv, act,
                   [d.memory_bytes for d in devices])

    @property
    def n(self) -> int:
        return self.lm.n

    @property
    def m(self) -> int:
        return len(self.devices)

    def fits(self, m: int, a: int, b: int) -> bool:
        limit = self.memory_limits[m]
        return limit is None or int(self.memory_need[a, b]) <= limit

    def link_request_ms(self, m: int, c: int) -> float:
        """Link m's share of one request with ``c`` blocks before it: the prefill's send and
        its first token back, then N-1 decode steps of both."""
        steps = self.workload.decode_steps
        return (self.forward_prefill[m][c].ms + self.back[m][c].ms
                + steps * (self.forward_decode[m][c].ms + self.back[m][c].ms))


def _check_window(lm: CausalLM, workload: LLMWorkload) -> None:
    """A sliding window is planned only where it changes nothing: every cache within
    ``window - 1`` tokens (CausalLMShape.window_context says why not ``window``). There the
    model is exactly full attention, so every cost and KV size here stays as it is."""
    limit = lm.shape.window_context
    if limit is not None and workload.context > limit:
        raise ConfigError(f"{option('max_context', workload.context)} does not fit the "
                          f"sliding window of {lm.name} ({lm.shape.window} tokens), which "
                          f"edgesplit runs as full attention, exact up to {limit} tokens: plan "
                          f"a {option('max_context')} (prompt + new tokens) of at most {limit}")


def _range_memory(lm: CausalLM, workload: LLMWorkload, prefill: Phase
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Weights, KV caches and working memory of every block range [a, b) (a <= b)."""
    n = lm.n
    weights = np.zeros((n + 1, n + 1), dtype=np.int64)
    kv = np.zeros_like(weights)
    act = np.zeros_like(weights)
    per_block_act = [lm.activation_bytes(i, prefill) for i in range(n)]
    cache_tokens = workload.sessions * workload.context
    for a in range(n + 1):
        act[a, a] = lm.boundary_bytes(a, prefill)  # a relay buffers what it passes on
        for b in range(a + 1, n + 1):
            weights[a, b] = lm.stage_param_bytes(a, b)
            kv[a, b] = lm.kv_bytes_per_token(a, b) * cache_tokens
            act[a, b] = max(per_block_act[a:b])
    return weights, kv, act

"""One device's stage of a causal LM plan, runnable: ``blocks[start:end]`` of ``Plan.llm``
taken from the model the plan names, run over a KV cache of its own.

Where the plan names a real checkpoint (``Plan.llm.fingerprint`` set), the stage builds the
model's skeleton without memory and reads only its own modules' tensors from the
checkpoint's safetensors (:func:`~edgesplit.llm.model.checkpoint.load_modules`), after
checking the checkpoint's fingerprint against the plan's. Otherwise it builds the whole model
from the plan's source with seeded random weights (:func:`create_causal_lm`: seed 0, so every
device holds identical weights) and keeps only its blocks' modules and the shared ones
(``shared_modules``: a Llama's rotary embedding).

A step runs the stage on ``tokens`` new positions starting at ``position`` (the tokens its
cache already holds): the prompt for the prefill, one token per decode step. The stage's
decoder layers keep their own layer index, so the cache (a transformers ``DynamicCache`` for
the whole depth) only ever fills this stage's layers, and the causal mask is sized against the
stage's first layer. A model with a sliding window runs without it (mask and cache of full
attention): its plan's context fits where the window changes nothing. The stage holding the
head picks the next token from the last position's logits
(:func:`~edgesplit.llm.stage.sampling.sample`: greedy unless told otherwise).

That is a float plan's stage (``float32``, ``float16``, ``bfloat16``). A plan of quantized
weights runs :class:`~edgesplit.llm.stage.quantized_compute.QuantizedStageModel` instead, with
the same surface (:class:`StageModel`); :func:`open_stage` picks by the plan's precision.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import nn

from edgesplit.errors import ConfigError
from edgesplit.hardware.accelerator import torch_device as torch_device_of
from edgesplit.llm.stage.sampling import Sampling, sample
from edgesplit.models.causal_lm import full_attention_config
from edgesplit.plan.model import LLMPlan, Plan

__all__ = ["LLMStageModel", "StageIO", "StageModel", "fingerprint_error", "llm_section",
           "open_plan_checkpoint", "open_stage", "stage_io"]

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def llm_section(plan: Plan) -> LLMPlan:
    """The plan's ``llm`` section, or a ConfigError saying which command runs this plan."""
    if plan.llm is None:
        raise ConfigError("this plan has no causal LM stages (no llm section): run it with "
                          "`edgesplit serve` / `edgesplit run`; `edgesplit llm plan` makes "
                          "LLM plans")
    return plan.llm


@dataclass(frozen=True)
class StageIO:
    """What stage ``index`` receives and sends on the wire: ``input_ids`` (it starts at the
    embedding) or the hidden state ``<block>.out`` (``hidden``: True), and ``token`` when it
    ends with the head (else the hidden state it forwards). Empty stages relay."""

    index: int
    start: int
    end: int
    receives: str  # tensor name
    hidden_in: bool
    sends: str  # tensor name ("token" when the stage holds the head)

    @property
    def empty(self) -> bool:
        return self.start == self.end


def _tensor_at(llm: LLMPlan, boundary: int) -> str:
    """The tensor crossing block boundary ``boundary`` (0: the prompt, n: the token)."""
    if boundary == 0:
        return "input_ids"
    if boundary == len(llm.blocks):
        return "token"
    return f"{llm.blocks[boundary - 1].name}.out"


def stage_io(llm: LLMPlan, index: int) -> StageIO:
    stage = llm.stages[index]
    return StageIO(index, stage.start, stage.end, _tensor_at(llm, stage.start),
                   0 < stage.start < len(llm.blocks), _tensor_at(llm, stage.end))


def _build_model(plan: Plan) -> nn.Module:
    from edgesplit.models.causal_lm import create_causal_lm, list_causal_lms

    source = plan.model.source
    if source not in list_causal_lms():
        raise ConfigError(f"the plan's model {source!r} is not a registered causal LM "
                          f"({', '.join(list_causal_lms())}) nor a checkpoint: the runtime "
                          "builds a config-only model by name so every device holds the "
                          "same weights")
    llm = llm_section(plan)
    model: nn.Module = create_causal_lm(source)
    return model.to(_DTYPES.get(llm.dtype, torch.float32))


class StageModel(Protocol):
    """What servers, clients and emulation use of a stage's compute: its wire ends (``io``),
    plan device and section, the dtype of the hidden state it takes, where it computes, an
    empty cache per session, and a step over one."""

    io: StageIO
    device: str
    llm: LLMPlan
    dtype: torch.dtype
    torch_device: torch.device

    def new_cache(self) -> Any: ...

    def step(self, x: torch.Tensor, position: int, cache: Any,
             sampling: Sampling | None = None) -> torch.Tensor: ...


def open_stage(plan: Plan, index: int, model: nn.Module | None = None,
               torch_device: str | torch.device | None = None, *,
               threads: int | None = None, sessions: int | None = None) -> StageModel:
    """Stage ``index`` of ``plan`` at the plan's precision: torch modules for a float one
    (``model``: the transformers model to take the blocks from, else the checkpoint or the
    source's seeded random weights; ``torch_device``: where they compute), one ONNX Runtime
    graph on ``threads`` CPU threads (default 1) for quantized weights, with KV cache rows
    preallocated for ``sessions`` (default: the plan's sessions)."""
    from edgesplit.llm.model.precision import FLOAT_BYTES

    if llm_section(plan).dtype in FLOAT_BYTES:
        return LLMStageModel(plan, index, model, torch_device)
    from edgesplit.llm.stage.quantized_compute import QuantizedStageModel

    return QuantizedStageModel(plan, index, model=model, torch_device=torch_device,
                               threads=threads, sessions=sessions)


def fingerprint_error(plan: Plan, source: str, found: str) -> ConfigError:
    """The checkpoint at ``source`` holds other weights than the plan's (``found``)."""
    planned = llm_section(plan).fingerprint or ""
    return ConfigError(f"the checkpoint at {source!r} is not the one the plan was made for "
                       f"(fingerprint {found[:12]}, the plan's {planned[:12]}): copy the "
                       "planned checkpoint here, or plan again for this one")


def open_plan_checkpoint(plan: Plan) -> Any:
    """The checkpoint the plan was made for (None: random weights); ConfigError when the
    checkpoint at its source is missing or holds other weights (another fingerprint)."""
    from edgesplit.llm.model.checkpoint import open_checkpoint

    llm = llm_section(plan)
    if llm.fingerprint is None:
        return None
    source = plan.model.local_source  # a path in a plan file is relative to that file
    checkpoint = open_checkpoint(source)
    if checkpoint is None:
        raise ConfigError(f"the plan was made for the checkpoint {plan.model.source!r}, which "
                          f"is not at {source!r}: put the same checkpoint there on this device")
    if checkpoint.fingerprint != llm.fingerprint:
        raise fingerprint_error(plan, source, checkpoint.fingerprint)
    return checkpoint


class LLMStageModel:
    """Stage ``index`` of ``plan`` as modules, and :meth:`step` over a session's cache."""

    def __init__(self, plan: Plan, index: int, model: nn.Module | None = None,
                 torch_device: str | torch.device | None = None) -> None:
        self.llm = llm_section(plan)
        if self.llm.dtype not in _DTYPES:
            raise ConfigError(f"the plan's precision {self.llm.dtype!r} is not a torch stage's "
                              f"({', '.join(_DTYPES)}): open it with open_stage, which runs "
                              "quantized weights")
        # checked first: a missing accelerator is one line, before any weight is read
        self.torch_device = torch_device_of(torch_device)
        if not 0 <= index < len(self.llm.stages):
            raise ConfigError(f"stage {index} is not in the plan (it has "
                              f"{len(self.llm.stages)})")
        self.io = stage_io(self.llm, index)
        self.device = self.llm.stages[index].device
        self.dtype = _DTYPES.get(self.llm.dtype, torch.float32)
        self.config: Any = None
        self.blocks: list[tuple[str, list[nn.Module]]] = []
        self.rotary: nn.Module | None = None
        self.first_layer: int | None = None
        self.modules: dict[str, nn.Module] = {}
        if self.io.empty:
            return
        blocks = self.llm.blocks[self.io.start:self.io.end]
        decoders = any(b.kind == "decoder" for b in blocks)
        shared = list(self.llm.shared_modules) if decoders else []
        paths = [p for b in blocks for p in b.modules] + shared
        self.config, found = self._modules(plan, paths, model)
        if self.torch_device.type != "cpu":
            # in place: modules sharing a tensor (tied embeddings) keep sharing it; a caller's
            # model (tests) moves with them
            for module in found.values():
                module.to(self.torch_device)
        self.modules = found
        self.blocks = [(b.kind, [found[path] for path in b.modules]) for b in blocks]
        # the shared modules a stage needs: the rotary embedding, for its decoder layers
        self.rotary = next((found[p] for p in shared if hasattr(found[p], "inv_freq")), None)
        layers = [mods[0] for kind, mods in self.blocks if kind == "decoder"]
        self.first_layer = _layer_index(layers[0]) if layers else None

    def _modules(self, plan: Plan, paths: list[str], model: nn.Module | None
                 ) -> tuple[Any, dict[str, nn.Module]]:
        """The stage's modules by path: the caller's model's (tests: the same weights as a
        reference), the checkpoint's (only these read), or a seeded random model's."""
        checkpoint = open_plan_checkpoint(plan) if model is None else None
        if checkpoint is not None:
            from edgesplit.llm.model.checkpoint import load_modules

            _check_context(checkpoint.config(), self.llm)
            return load_modules(checkpoint, paths, self.dtype)
        full = model if model is not None else _build_model(plan)
        _check_context(full.config, self.llm)
        self.dtype = next(full.parameters()).dtype
        # a sliding window off, as load_modules does: the mask and the caches are then those
        # of full attention, which the plan's context within the window makes exact
        config: Any = full.config
        return full_attention_config(config), {path: full.get_submodule(path) for path in paths}

    def tensors(self) -> dict[str, torch.Tensor]:
        """Every parameter and buffer the stage holds, by ``module path.name`` (a tensor
        shared by two modules once)."""
        held: dict[str, torch.Tensor] = {}
        seen: set[int] = set()
        for path, m in self.modules.items():
            for name, t in [*m.named_parameters(), *m.named_buffers()]:
                if id(t) not in seen:
                    seen.add(id(t))
                    held[f"{path}.{name}"] = t
        return held

    def new_cache(self) -> Any:
        """An empty KV cache for one session (None: the stage has no decoder layers)."""
        if self.first_layer is None:
            return None
        from transformers import DynamicCache

        return DynamicCache(config=self.config)

    @torch.no_grad()
    def step(self, x: torch.Tensor, position: int, cache: Any,
             sampling: Sampling | None = None) -> torch.Tensor:
        """Run the stage on ``x`` (token ids ``[1, T]`` or a hidden state ``[1, T, H]``)
        for positions ``position .. position + T - 1``; returns the hidden state it forwards,
        or, when it ends with the head, the next token ``[1, 1]`` picked by ``sampling``
        (default greedy) for position ``position + T``; FloatingPointError when the hidden
        state it reached is not finite (:meth:`_check_finite`). Whatever device computes,
        what it returns is in host memory (the wire's)."""
        h = x.to(self.torch_device, self.dtype if self.io.hidden_in else x.dtype)
        tokens = int(x.shape[1])
        positions = torch.arange(position, position + tokens,
                                 device=self.torch_device).unsqueeze(0)
        attention: tuple[Any, dict[str, Any]] | None = None  # made once, for every layer
        for kind, modules in self.blocks:
            if kind == "embed":
                h = _embed(modules, h, positions)
            elif kind == "decoder":
                if attention is None:
                    attention = self._attention_inputs(h, positions, cache)
                mask, rope = attention
                h = modules[0](h, attention_mask=mask, position_ids=positions, cache=cache,
                               use_cache=True, **rope)
                h = h[0] if isinstance(h, tuple) else h
            else:  # head: only the last position's logits pick the next token
                self._check_finite(h)
                h = h[:, -1:, :]
                for m in modules:
                    h = m(h)
                if sampling is None or sampling.greedy:
                    return h.argmax(dim=-1).cpu()
                # on the CPU: a seeded draw is the same whichever device made the logits
                picked = sample(h.reshape(-1).cpu(), sampling, position + tokens)
                return torch.tensor([[picked]], dtype=torch.int64)
        self._check_finite(h)
        return h.cpu()

    def _check_finite(self, h: torch.Tensor) -> None:
        """FloatingPointError when the stage's blocks made a NaN or infinity (an overflow in
        half precision, broken weights): its KV cache then holds them too, and every later
        token of the session would be garbage without an error; raised inside the session's
        step, the cache is rolled back to what it held."""
        if h.is_floating_point() and not bool(torch.isfinite(h).all()):
            raise FloatingPointError(
                f"blocks [{self.io.start}, {self.io.end}) on {self.device!r} produced NaN or "
                f"infinite values ({self.dtype} overflow, or broken weights); the step's "
                "cache entries were dropped")

    def _attention_inputs(self, h: torch.Tensor, positions: torch.Tensor, cache: Any
                          ) -> tuple[Any, dict[str, Any]]:
        """The causal mask (None where SDPA's own causal flag does the same) and, for rotary
        models, the position embeddings every layer of the stage shares."""
        from transformers.masking_utils import create_causal_mask

        mask = create_causal_mask(config=self.config, inputs_embeds=h, attention_mask=None,
                                  cache=cache, position_ids=positions,
                                  layer_idx=self.first_layer)
        rope = {} if self.rotary is None else \
            {"position_embeddings": self.rotary(h, position_ids=positions)}
        return mask, rope


def _check_context(config: Any, llm: LLMPlan) -> None:
    """Refuse a plan whose max context passes the model's positions or its sliding window
    (the planner makes neither; an edited plan or another checkpoint could): past its
    positions a model has no embedding for a token (an index error mid-session, or garbage),
    and the stage runs a window as full attention, exact only within it; either would
    otherwise fail or answer wrongly only once a session grew that long."""
    from edgesplit.llm.model.description import CausalLMShape

    shape = CausalLMShape.from_config(config)
    if llm.max_context > shape.max_positions:
        raise ConfigError(f"the plan's max context of {llm.max_context} tokens passes this "
                          f"model's {shape.max_positions} positions (max_position_embeddings):"
                          f" plan it again with --max-context {shape.max_positions} or less")
    limit = shape.window_context
    if limit is not None and llm.max_context > limit:
        raise ConfigError(f"the plan's max context of {llm.max_context} tokens passes this "
                          f"model's sliding window (exact up to {limit}): plan it again "
                          f"with --max-context {limit} or less")


def _layer_index(layer: nn.Module) -> int:
    for m in layer.modules():
        index = getattr(m, "layer_idx", None)
        if isinstance(index, int):
            return index
    raise ConfigError(f"decoder layer {type(layer).__name__} names no layer index: the "
                      "runtime cannot size its KV cache")


def _embed(modules: list[nn.Module], ids: torch.Tensor, positions: torch.Tensor
           ) -> torch.Tensor:
    """The embed block: the token embedding, then learned position embeddings (GPT-2's wpe)
    added and any other module (dropout) applied, in the block's order."""
    h = modules[0](ids)
    for m in modules[1:]:
        h = h + m(positions) if isinstance(m, nn.Embedding) else m(h)
    return h


"""One device's stage of a causal LM plan, runnable: ``blocks[start:end]`` of ``Plan.llm``
taken from the model the plan names, run over a KV cache of its own.

Every process builds the whole model from the plan's source (:func:`create_causal_lm`: seed 0,
so every device holds identical weights) and keeps only its blocks' modules and the shared ones
(``shared_modules``: a Llama's rotary embedding). A step runs the stage on ``tokens`` new
positions starting at ``position`` (the tokens its cache already holds): the prompt for the
prefill, one token per decode step. The stage's decoder layers keep their own layer index, so
the cache (a transformers ``DynamicCache`` for the whole depth) only ever fills this stage's
layers, and the causal mask is sized against the stage's first layer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from edgesplit.errors import ConfigError
from edgesplit.plan.model import LLMPlan, Plan

__all__ = ["LLMStageModel", "StageIO", "llm_section", "stage_io"]

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
                          f"({', '.join(list_causal_lms())}): the runtime builds the model by "
                          "name so every device holds the same weights")
    llm = llm_section(plan)
    model: nn.Module = create_causal_lm(source)
    return model.to(_DTYPES.get(llm.dtype, torch.float32))


class LLMStageModel:
    """Stage ``index`` of ``plan`` as modules, and :meth:`step` over a session's cache."""

    def __init__(self, plan: Plan, index: int, model: nn.Module | None = None) -> None:
        self.llm = llm_section(plan)
        if not 0 <= index < len(self.llm.stages):
            raise ConfigError(f"stage {index} is not in the plan (it has "
                              f"{len(self.llm.stages)})")
        self.io = stage_io(self.llm, index)
        self.device = self.llm.stages[index].device
        if self.io.empty:
            self.config: Any = None
            self.blocks: list[tuple[str, list[nn.Module]]] = []
            self.rotary: nn.Module | None = None
            self.first_layer: int | None = None
            self.dtype = _DTYPES.get(self.llm.dtype, torch.float32)
            return
        # model: the caller's own (tests: the same weights as a reference) or built from source
        full = model if model is not None else _build_model(plan)
        self.config = full.config
        self.dtype = next(full.parameters()).dtype
        blocks = self.llm.blocks[self.io.start:self.io.end]
        self.blocks = [(b.kind, [full.get_submodule(path) for path in b.modules])
                       for b in blocks]
        shared = [full.get_submodule(p) for p in self.llm.shared_modules]
        # the shared modules a stage needs: the rotary embedding, for its decoder layers
        self.rotary = next((m for m in shared if hasattr(m, "inv_freq")), None)
        layers = [mods[0] for kind, mods in self.blocks if kind == "decoder"]
        self.first_layer = _layer_index(layers[0]) if layers else None

    def new_cache(self) -> Any:
        """An empty KV cache for one session (None: the stage has no decoder layers)."""
        if self.first_layer is None:
            return None
        from transformers import DynamicCache

        return DynamicCache(config=self.config)

    @torch.no_grad()
    def step(self, x: torch.Tensor, position: int, cache: Any) -> torch.Tensor:
        """Run the stage on ``x`` (token ids ``[1, T]`` or a hidden state ``[1, T, H]``)
        for positions ``position .. position + T - 1``; returns the hidden state it forwards,
        or the greedy next token ``[1, 1]`` when it ends with the head."""
        h = x if not self.io.hidden_in else x.to(self.dtype)
        tokens = int(x.shape[1])
        positions = torch.arange(position, position + tokens).unsqueeze(0)
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
                h = h[:, -1:, :]
                for m in modules:
                    h = m(h)
                return h.argmax(dim=-1)
        return h

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


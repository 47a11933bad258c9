"""One device's stage of a plan of quantized weights (``q8_0``, ``q4_0``, ``q4_1``), runnable:
an :class:`~edgesplit.llm.stage.onnx_stage.OnnxStage` behind the surface every caller of a
stage uses (:class:`~edgesplit.llm.stage.compute.StageModel`), so servers, the client, the
engine and emulation run it as they run a torch stage.

Its weights (:func:`quantized_weights`): a GGUF file whose linear weights are of the plan's
type runs as stored (each tensor a view of the mapped file until the stage repacks it); any
other real checkpoint (a transformers Llama folder, a GGUF of another type through its
dequantised folder) is quantized as the stage loads its tensors
(:class:`~edgesplit.llm.model.quantize.QuantizedCheckpoint`). Either way the checkpoint's
fingerprint must be the plan's.

Blocks map to layers as the plan numbers them: ``embed`` is block 0, decoder layer ``i`` is
block ``i + 1``, the ``head`` block ``L + 1``; a stage of blocks ``[start, end)`` runs layers
``[max(start - 1, 0), min(end - 1, L))``, embeds where ``start == 0`` and ends with the head
where ``end == L + 2``. Activations, the KV cache (a row per session of a pool preallocated
for ``sessions`` at the plan's max context) and what crosses the wire are float32.

Concurrent steps (threads of a server or of a client's generations) meet in a
:class:`~edgesplit.llm.stage.batching.StepBatcher`: decode steps that queue while the stage
computes run as one batch (int8 activations: ~2.2x the tokens per second at 4 sessions than
one at a time, SmolLM2 Q4_1 on one core here; float activations gain little, MLAS computes
each row of a float batch apart).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from edgesplit.errors import ConfigError
from edgesplit.llm.model.precision import FLOAT_BYTES, GROUP_SIZE, QUANTIZED
from edgesplit.llm.stage.batching import StepBatcher
from edgesplit.llm.stage.compute import (
    fingerprint_error,
    llm_section,
    open_plan_checkpoint,
    stage_io,
)
from edgesplit.llm.stage.kv_pool import KVSlot
from edgesplit.llm.stage.onnx_stage import OnnxStage, RowStep
from edgesplit.llm.stage.sampling import Sampling, sample
from edgesplit.plan.model import LLMPlan, Plan

__all__ = ["QuantizedStageModel", "quantized_weights"]


def quantized_weights(plan: Plan) -> Any:
    """The weights of ``plan``'s quantized precision, read as
    :class:`~edgesplit.llm.model.gguf.GGUFModel` reads a GGUF; ConfigError for a plan of random
    weights, a precision no stage runs, or a checkpoint with another fingerprint."""
    llm = llm_section(plan)
    kind = _kind(llm)
    if llm.fingerprint is None:
        raise ConfigError(f"the plan's precision {llm.dtype} quantizes a real checkpoint and "
                          "this plan has random weights: plan a checkpoint, or plan it as "
                          "float32")
    from edgesplit.llm.model.checkpoint import gguf_file, gguf_fingerprint
    from edgesplit.llm.model.gguf import GGUFModel
    from edgesplit.llm.model.precision import gguf_linear_kind
    from edgesplit.llm.model.quantize import QuantizedCheckpoint

    source = plan.model.local_source  # a path in a plan file is relative to that file
    path = gguf_file(source)
    if path is not None:
        found = gguf_fingerprint(path)
        if found != llm.fingerprint:
            raise fingerprint_error(plan, source, found)
        model = GGUFModel(path)
        if gguf_linear_kind(model) == kind:  # as stored, no dequantised folder needed
            return model
    return QuantizedCheckpoint(open_plan_checkpoint(plan), kind)


def _kind(llm: LLMPlan) -> str:
    """The GGUF type of the plan's quantized weights; ConfigError where no stage runs them."""
    kind = QUANTIZED.get(llm.dtype)
    if kind is None:
        known = ", ".join((*FLOAT_BYTES, *QUANTIZED))
        raise ConfigError(f"the plan's precision {llm.dtype!r} is not one a stage runs "
                          f"({known}): plan it again with this edgesplit")
    if llm.group_size != GROUP_SIZE:
        raise ConfigError(f"the plan quantizes in groups of {llm.group_size}; the quantized "
                          f"stage runs groups of {GROUP_SIZE}: plan it again")
    return kind


class QuantizedStageModel:
    """Stage ``index`` of a plan of quantized weights on ``threads`` ONNX Runtime threads
    (default 1) with KV cache rows for ``sessions`` sessions (default: the plan's), and
    :meth:`step` over a session's :class:`~edgesplit.llm.stage.kv_pool.KVSlot`, safe to call
    from several threads at once (their decode steps batch)."""

    def __init__(self, plan: Plan, index: int, *, model: Any = None,
                 torch_device: str | torch.device | None = None,
                 threads: int | None = None, sessions: int | None = None) -> None:
        self.llm = llm_section(plan)
        if model is not None:
            raise ConfigError("a quantized stage reads its weights from the plan's checkpoint; "
                              "a model passed in applies to float plans only")
        if torch_device is not None and torch.device(torch_device).type != "cpu":
            raise ConfigError(f"the quantized stage computes on the CPU (ONNX Runtime's "
                              f"kernels), not {str(torch_device)!r}: leave --torch-device out")
        if not 0 <= index < len(self.llm.stages):
            raise ConfigError(f"stage {index} is not in the plan (it has "
                              f"{len(self.llm.stages)})")
        self.io = stage_io(self.llm, index)
        self.device = self.llm.stages[index].device
        self.dtype = torch.float32  # the hidden state it takes and sends
        self.torch_device = torch.device("cpu")
        _kind(self.llm)  # a relay too runs only a plan it can
        self.runner: OnnxStage | None = None
        if self.io.empty:  # it relays: no weights, no checkpoint needed here
            return
        layers, sessions = self.llm.num_layers, sessions or self.llm.sessions
        self.runner = OnnxStage(quantized_weights(plan), max(self.io.start - 1, 0),
                                min(self.io.end - 1, layers), embed=self.io.start == 0,
                                head=self.io.end == layers + 2,
                                max_context=self.llm.max_context, threads=threads or 1,
                                activations=self.llm.activations, sessions=sessions)
        self.steps: StepBatcher[RowStep] = StepBatcher(
            self.runner.step_batch, lambda st: st.x.shape[1] == 1, max_batch=sessions)

    @property
    def weight_bytes(self) -> int:
        """Bytes of weights the stage's graph holds (its embedding is the GGUF's own pages,
        mapped: only the rows it looks up become resident)."""
        return 0 if self.runner is None else self.runner.weight_bytes

    def new_cache(self) -> KVSlot | None:
        """An empty KV cache for one session, a row of the stage's pool (None: the stage
        holds no block); SessionsBusyError when every row is in use."""
        return None if self.runner is None else self.runner.new_cache()

    @torch.no_grad()
    def step(self, x: torch.Tensor, position: int, cache: KVSlot | None,
             sampling: Sampling | None = None) -> torch.Tensor:
        """As :meth:`LLMStageModel.step <edgesplit.llm.stage.compute.LLMStageModel.step>`:
        the hidden state ``[1, T, H]`` it forwards (float32), or where it ends with the head
        the next token ``[1, 1]`` (greedy, or drawn by ``sampling`` for position
        ``position + T``); FloatingPointError when what it computed is not finite."""
        if self.runner is None:
            return x
        tokens = int(x.shape[1])
        # numpy, not torch, from here on: right after compute each torch call costs tens of
        # microseconds (cold caches), a numpy one a third of that (measured)
        fed = x.numpy() if not self.io.hidden_in or x.dtype == torch.float32 \
            else x.to(torch.float32).numpy()
        if cache is None:  # a stage of the embedding or head alone: nothing to batch
            got = self.runner.step(fed, position, None)
        else:
            got = self.steps.run(RowStep(fed, position, cache))
        out = np.asarray(got)
        self._check_finite(out)
        if not self.runner.has_head:
            return torch.from_numpy(out)
        logits = out.reshape(-1)
        if sampling is None or sampling.greedy:  # numpy's argmax: the first maximum, as torch's
            return torch.tensor([[int(logits.argmax())]], dtype=torch.int64)
        return torch.tensor([[sample(torch.from_numpy(logits), sampling, position + tokens)]],
                            dtype=torch.int64)

    def _check_finite(self, out: np.ndarray) -> None:
        if not np.isfinite(out).all():
            raise FloatingPointError(
                f"blocks [{self.io.start}, {self.io.end}) on {self.device!r} produced NaN or "
                "infinite values (broken weights); the step's cache entries were dropped")

"""Real quality of a partly quantized model on held-out data.

``QualityMeter`` runs fake-quantized programs (``fake_quant_program``) over held-out samples
and reports the model's quality measure in percent: top-1 accuracy when the data has labels,
otherwise the mean cosine similarity of each sample's outputs to the float model's (sentence
embeddings, detection heads). The drop is float quality minus quantized quality, in percentage
points. The program must be captured at the batch size the meter batches by (captured programs
are shape-specialised); ``EvalData.batches`` pads the last batch and padded rows are ignored.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import torch

from edgesplit.data.images import EvalSet
from edgesplit.graph import LayerGraph
from edgesplit.quant.fakequant import Calibration, QuantizableProgram, graph_program

__all__ = ["Quality", "QualityMeter"]


@dataclass(frozen=True)
class Quality:
    metric: str  # "top1" (accuracy, %) or "cosine" (similarity to float outputs, %)
    value: float
    reference: float  # the float model's value on the same samples
    samples: int

    @property
    def drop(self) -> float:
        return self.reference - self.value


def _flat_outputs(out: object, first_only: bool) -> torch.Tensor:
    """Per-sample outputs as rows: the first output (class logits) or all of them joined."""
    tensors = [t for t in (out if isinstance(out, (tuple, list)) else (out,))
               if isinstance(t, torch.Tensor)]
    if first_only:
        tensors = tensors[:1]
    return torch.cat([t.reshape(t.shape[0], -1).float() for t in tensors], dim=1)


class QualityMeter:
    """Measures fake-quantized variants of ``graph`` on ``data`` (see the module docstring)."""

    def __init__(self, graph: LayerGraph, data: EvalSet, calibration: Calibration,
                 batch_size: int) -> None:
        self.graph, self.data, self.calibration = graph, data, calibration
        self.batch_size = batch_size
        self._reference = [self._run(graph_program(graph), batch)[:real]
                           for batch, real in self._batches()]
        self.reference = self._score(self._reference)
        self._cache: dict[tuple, float] = {}
        self._program: QuantizableProgram | None = None  # built on the first quantized run

    def _batches(self) -> Iterator[tuple[tuple[torch.Tensor, ...], int]]:
        # batched again for each variant: a streamed set is transformed on the fly, never held
        return self.data.batches(self.batch_size)

    def _run(self, program: torch.nn.Module, batch: tuple[torch.Tensor, ...]) -> torch.Tensor:
        with torch.no_grad():
            return _flat_outputs(program(*batch), first_only=self.data.labels is not None)

    def _score(self, outputs: list[torch.Tensor]) -> float:
        if self.data.labels is not None:
            pred = torch.cat(outputs).argmax(1)
            return 100.0 * float((pred == self.data.labels).float().mean())
        sims = [torch.nn.functional.cosine_similarity(o, r, dim=1)
                for o, r in zip(outputs, self._reference, strict=True)]
        return 100.0 * float(torch.cat(sims).mean())

    def measure(self, bits: Mapping[str, tuple[int, int]]) -> Quality:
        """Quality with each named layer at ``(w_bits, a_bits)``; other layers stay float."""
        key = tuple(sorted(bits.items()))
        if key not in self._cache:
            if not bits:
                value = self.reference
            else:
                if self._program is None:
                    self._program = QuantizableProgram(self.graph, self.calibration)
                program = self._program.configure(bits)
                value = self._score([self._run(program, batch)[:real]
                                     for batch, real in self._batches()])
            self._cache[key] = value
        return Quality(self.data.metric, self._cache[key], self.reference, len(self.data))

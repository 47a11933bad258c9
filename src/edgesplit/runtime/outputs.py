"""A split run's outputs, row by row: the rows of an inputs file cut into the requests the plan
takes (:func:`load_rows`, :func:`split_rows`), each request's outputs put back in row order with
the difference from the unsplit model per row and, for a classifier, its top-1 class
(:class:`OutputCollector`, :class:`RunOutputs`), written as ``.npz`` (:func:`write_outputs`)
or summarised in ``edgesplit run --json`` (:meth:`RunOutputs.document`).

A plan is captured at a fixed batch size (its example input's dimension 0), which its first
device's program bakes in: a request carries exactly that many rows, so the rows must divide
into it. A server started with ``--max-batch`` batches requests that arrive together (from
several clients) on its side; the client never changes a request's size.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from edgesplit.errors import ConfigError
from edgesplit.runtime.program import PlanProgram

if TYPE_CHECKING:
    from edgesplit.runtime.client import RequestResult

__all__ = ["INLINE_VALUES", "OutputCollector", "Rows", "RunOutputs", "check_out_path",
           "infer_rows", "load_rows", "split_rows", "write_outputs"]

# output values a JSON document holds inline at most (an image classifier's logits for ten
# rows); beyond, the document says to write them with --out (a JSON number per line would
# make a segmentation run's report gigabytes)
INLINE_VALUES = 10_000

Batch = tuple[torch.Tensor, ...]


@dataclass(frozen=True)
class Rows:
    """An inputs file as requests: ``batches[i]`` carries rows ``i * batch`` to
    ``(i + 1) * batch - 1`` of every model input; ``labels`` the file's own class ids, if any."""

    batches: list[Batch]
    batch: int
    labels: torch.Tensor | None = None

    def __len__(self) -> int:
        return len(self.batches) * self.batch


def split_rows(program: PlanProgram, inputs: Sequence[torch.Tensor], where: str = "inputs"
               ) -> list[Batch]:
    """``inputs`` (one tensor per model input, samples along dimension 0) cut into the plan's
    batch size, each cast to the dtype the model takes. ``where`` names them in an error."""
    refs = program.graph.example_inputs
    if len(inputs) != len(refs):
        raise ConfigError(f"{where}: the model takes {len(refs)} input(s), got {len(inputs)}")
    batch = int(refs[0].shape[0])
    rows = {int(x.shape[0]) if x.dim() else 0 for x in inputs}
    if len(rows) != 1:
        raise ConfigError(f"{where}: every input needs the same number of rows along "
                          f"dimension 0; got {sorted(rows)}")
    for x, ref in zip(inputs, refs, strict=True):
        if tuple(x.shape[1:]) != tuple(ref.shape[1:]):
            raise ConfigError(f"{where}: samples of shape {tuple(x.shape[1:])}, the plan's "
                              f"model takes {tuple(ref.shape[1:])}")
    n = rows.pop()
    if n == 0 or n % batch:
        raise ConfigError(f"{where}: {n} samples do not divide into batches of {batch} (the "
                          f"plan's batch size): give a multiple of {batch} rows")
    return [tuple(x[i:i + batch].to(ref.dtype) for x, ref in zip(inputs, refs, strict=True))
            for i in range(0, n, batch)]


def load_rows(path: str | Path, program: PlanProgram) -> Rows:
    """The rows of a .pt/.npz inputs file (``inputs``, or ``inputs_0``, ``inputs_1``, ...,
    and optionally ``labels``, as in evaluation data files) as the plan's requests."""
    from edgesplit.data import load_eval_data

    data = load_eval_data(str(path))
    batches = split_rows(program, data.inputs, str(path))
    return Rows(batches, int(batches[0][0].shape[0]), data.labels)


def infer_rows(request: Callable[[Batch], RequestResult], program: PlanProgram,
               inputs: Sequence[torch.Tensor]) -> Batch:
    """Every row of ``inputs`` through ``request`` (a client's), one request per batch in
    order; the model's outputs with the rows in order."""
    batches = split_rows(program, inputs)
    answers = [request(b).outputs for b in batches]
    return tuple(torch.cat([a[k] for a in answers]) if _per_row(answers[0], len(batches[0][0]))
                 else torch.stack([a[k] for a in answers]) for k in range(len(answers[0])))


def _per_row(outputs: Batch, batch: int) -> bool:
    """Whether every output has the request's rows along dimension 0 (else each request's
    output is one unit: a model that reduces over its batch)."""
    return all(o.dim() > 0 and o.shape[0] == batch for o in outputs)


@dataclass(frozen=True)
class RunOutputs:
    """A run's outputs in input order. A unit is a row, or a request where an output has no
    row dimension (``per_row`` false; ``unit`` in the document). ``values``: one tensor per
    model output (``names``), units along dimension 0, zero (NaN for floats) where a unit got
    no answer (``answered``); ``max_abs_diff``: per unit, against the unsplit model on the
    same input; ``top1`` and ``unsplit_top1``: a classifier's argmax per row (one output of
    shape [rows, classes]; -1 where unanswered), else None; ``labels``: the inputs file's own,
    if it had some."""

    names: list[str]
    values: Batch
    answered: torch.Tensor
    max_abs_diff: torch.Tensor
    per_row: bool
    batch: int
    top1: torch.Tensor | None = None
    unsplit_top1: torch.Tensor | None = None
    labels: torch.Tensor | None = None

    def __len__(self) -> int:
        return int(self.answered.shape[0])

    def arrays(self) -> dict[str, np.ndarray]:
        """What :func:`write_outputs` stores, by key."""
        values = ({"outputs": self.values[0].numpy()} if len(self.values) == 1 else
                  {f"outputs_{k}": v.numpy() for k, v in enumerate(self.values)})
        extra = {"top1": self.top1, "unsplit_top1": self.unsplit_top1, "labels": self.labels}
        return {**values, "output_names": np.asarray(self.names),
                "answered": self.answered.numpy(), "max_abs_diff": self.max_abs_diff.numpy(),
                **{k: v.numpy() for k, v in extra.items() if v is not None}}

    def document(self, path: Path | None = None) -> dict[str, Any]:
        """The ``outputs`` section of ``edgesplit run --json``: sizes, the classifier's labels
        and agreement, and per unit either inline (small outputs, no ``path``) or in ``path``."""
        doc: dict[str, Any] = {
            "unit": "row" if self.per_row else "request", "count": len(self),
            "answered": int(self.answered.sum()), "batch": self.batch,
            "tensors": [{"name": n, "shape": list(v.shape), "dtype": str(v.dtype)
                         .removeprefix("torch.")} for n, v in zip(self.names, self.values,
                                                                  strict=True)],
            "max_abs_diff_max": _nan_max(self.max_abs_diff),
            "classifier": self.top1 is not None}
        if self.top1 is not None and self.unsplit_top1 is not None:
            doc["top1"] = "argmax over dimension 1 of the output (shape [rows, classes])"
            agree = torch.eq(self.top1, self.unsplit_top1)
            doc["top1_agree"] = int(agree[self.answered].sum())
        if self.labels is not None and self.top1 is not None:
            doc["accuracy"] = {"split": _accuracy(self.top1, self.labels, self.answered),
                               "unsplit": _accuracy(self.unsplit_top1, self.labels,
                                                    self.answered)}
        if path is not None:
            return {**doc, "file": str(path)}
        return {**doc, **self._inline()}

    def _inline(self) -> dict[str, Any]:
        """Per unit, inline: the differences, labels and (when small) the values."""
        doc: dict[str, Any] = {"max_abs_diff": _floats(self.max_abs_diff)}
        if self.top1 is not None:
            doc["top1_labels"] = self.top1.tolist()
            doc["unsplit_top1_labels"] = self.unsplit_top1.tolist() if (
                self.unsplit_top1 is not None) else None
        count = sum(v.numel() for v in self.values)
        if count <= INLINE_VALUES:
            doc["values"] = {n: _floats(v) if v.is_floating_point() else v.tolist()
                             for n, v in zip(self.names, self.values, strict=True)}
        else:
            doc["values_omitted"] = (f"{count} values (over {INLINE_VALUES}): give --out "
                                     "FILE.npz to write them")
        return doc


def _floats(t: torch.Tensor) -> Any:
    """Nested lists with NaN as None (JSON has no NaN)."""
    arr = t.double().numpy()
    kept = arr.astype(object)
    kept[np.isnan(arr)] = None
    return kept.tolist()


def _nan_max(t: torch.Tensor) -> float | None:
    kept = t[~torch.isnan(t)]
    return float(kept.max()) if kept.numel() else None


def _accuracy(top1: torch.Tensor | None, labels: torch.Tensor, answered: torch.Tensor
              ) -> float | None:
    if top1 is None or not bool(answered.any()):
        return None
    return float((top1 == labels)[answered].float().mean())


class OutputCollector:
    """Gathers a run's answers (``add``, safe from several client threads; a request repeated
    keeps its first answer) into :class:`RunOutputs` (``result``)."""

    def __init__(self, program: PlanProgram, batches: Sequence[Batch],
                 labels: torch.Tensor | None = None) -> None:
        self.names, self.batches, self.labels = program.outputs, list(batches), labels
        self._got: dict[int, tuple[Batch, Batch]] = {}
        self._lock = threading.Lock()

    def add(self, which: int, result: RequestResult, reference: Batch) -> None:
        """Request ``which`` (an index into the batches) was answered with ``result``; the
        unsplit model gives ``reference`` on the same input (``run_requests``'s
        ``on_result``)."""
        with self._lock:
            self._got.setdefault(which, (tuple(result.outputs), reference))

    def result(self, reference: Callable[[Batch], Batch]) -> RunOutputs:
        """The outputs in order; ``reference`` gives the unsplit outputs' shapes where no
        request was answered (called once at most)."""
        batch = int(self.batches[0][0].shape[0])
        template = next(iter(self._got.values()))[1] if self._got else reference(
            self.batches[0])
        per_row = _per_row(template, batch)
        units = batch if per_row else 1
        answered = torch.zeros(len(self.batches) * units, dtype=torch.bool)
        diffs = torch.full((len(answered),), float("nan"), dtype=torch.float64)
        split = [_blank(t, len(self.batches), per_row) for t in template]
        ref = [_blank(t, len(self.batches), per_row) for t in template]
        for which, (outs, refs) in self._got.items():
            rows = slice(which * units, (which + 1) * units)
            answered[rows] = True
            diffs[rows] = _unit_diffs(outs, refs, per_row)
            for k in range(len(template)):
                split[k][rows] = outs[k] if per_row else outs[k].unsqueeze(0)
                ref[k][rows] = refs[k] if per_row else refs[k].unsqueeze(0)
        top1 = unsplit = None
        if per_row and len(split) == 1 and _is_classifier(split[0]):
            top1, unsplit = split[0].argmax(1), ref[0].argmax(1)
            top1[~answered] = unsplit[~answered] = -1  # no answer, no class
        return RunOutputs(list(self.names), tuple(split), answered, diffs, per_row, batch,
                          top1, unsplit, self.labels if per_row else None)


def _blank(template: torch.Tensor, requests: int, per_row: bool) -> torch.Tensor:
    """Room for every request's ``template``-like output, NaN (zero for integers) until an
    answer fills it."""
    shape = ((requests * template.shape[0], *template.shape[1:]) if per_row else
             (requests, *template.shape))
    fill = float("nan") if template.is_floating_point() else 0
    return torch.full(shape, fill, dtype=template.dtype)


def _unit_diffs(outs: Batch, refs: Batch, per_row: bool) -> torch.Tensor:
    """The largest |split - unsplit| of each row (or of the request) over every output."""
    per_output = [(o.double() - r.double()).abs().reshape(o.shape[0] if per_row else 1, -1)
                  .amax(1) for o, r in zip(outs, refs, strict=True)]
    return torch.stack(per_output).amax(0)


def _is_classifier(values: torch.Tensor) -> bool:
    """One score per class and row: [rows, classes], classes above one, floating point."""
    return values.is_floating_point() and values.dim() == 2 and values.shape[1] > 1


def check_out_path(path: str | Path, *, needs_input: bool = False) -> Path:
    """Refuse an outputs path before the run rather than after it: not an .npz, or (where
    ``needs_input``) no inputs file whose rows it would hold."""
    path = Path(path)
    if needs_input:
        raise ConfigError("--out writes the outputs of the rows of --input: give --input "
                          "FILE.npz too")
    if path.suffix != ".npz":
        raise ConfigError(f"--out writes an .npz file: name it FILE.npz, not {path.name!r}")
    if path.is_dir():
        raise ConfigError(f"--out {path} is a folder: give a file name ending in .npz")
    return path


def write_outputs(path: str | Path, outputs: RunOutputs) -> Path:
    """``outputs`` as an .npz (keys: :meth:`RunOutputs.arrays`); the path written."""
    path = check_out_path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        arrays: dict[str, Any] = outputs.arrays()
        np.savez(path, **arrays)
    except OSError as exc:
        raise ConfigError(f"cannot write the outputs to {path}: {exc.strerror}") from None
    return path

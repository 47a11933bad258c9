"""One side's copy of the chain in split training (device and server keep one each): its
optimizer, the parameters of the last sync (``base``), the elements it trained since, and the
means to refuse a round without a trace or take an update back (:class:`Snapshot`). Merging
two sides' updates follows the sync of :mod:`edgesplit.train.remote.protocol`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from edgesplit.train.remote.protocol import OPTIM_PREFIX, Tensors, Update, check_finite
from edgesplit.train.split import as_chain, seeded_forward

__all__ = ["Merged", "Replica", "Snapshot"]


@dataclass
class Snapshot:
    """What an update changes on one side, copied just before it (see :meth:`Replica.restore`):
    the updated elements' parameters, momentum (None: none yet) and buffers (as
    :meth:`Replica.save_buffers` saved them before the forward pass moved them), and the set
    of elements trained since the last sync."""

    params: list[tuple[torch.Tensor, torch.Tensor]]
    momentum: list[tuple[torch.Tensor, torch.Tensor | None]]
    buffers: list[tuple[torch.Tensor, torch.Tensor]]
    trained: set[int]


@dataclass
class Merged:
    """An element's state after a merge, computed into new tensors before anything changes."""

    params: Tensors
    buffers: Tensors | None  # None: keep this side's (it owns the element)


class Replica:
    """One side's copy of the chain: its optimizer, the base snapshot of the last sync and the
    elements it trained since then."""

    def __init__(self, model: nn.Module, lr: float, momentum: float, seed: int) -> None:
        self.model, self.chain, self.seed = model, as_chain(model), seed
        unique = {id(p): p for p in model.parameters() if p.requires_grad}
        self.params = list(unique.values())
        self.opt = torch.optim.SGD(self.params, lr=lr, momentum=momentum) if unique else None
        self.base = {i: {n: p.detach().clone() for n, p in m.named_parameters()}
                     for i, m in enumerate(self.chain)}
        self.trained: set[int] = set()

    def part(self, lo: int, hi: int) -> nn.Sequential:
        """chain[lo:hi] as one module, in train mode (draws unseeded: for inspection)."""
        return nn.Sequential(*self.chain[lo:hi]).train()

    def forward(self, lo: int, hi: int, x: torch.Tensor, round_: int) -> torch.Tensor:
        """chain[lo:hi] in train mode on ``x``; the random draws of round ``round_`` (dropout,
        drop-connect) come from per-element seeds, as in unsplit training
        (:func:`~edgesplit.train.split.seeded_forward`), wherever the cut is."""
        for module in self.chain[lo:hi]:
            module.train()
        return seeded_forward(self.chain, lo, hi, x, self.seed, round_)

    # -- one round, refusable until the update --------------------------------------------------
    def save_buffers(self, elements: Iterable[int]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Copies of the buffers a forward pass in train mode moves (batch-norm statistics)."""
        return [(b, b.detach().clone()) for i in elements for b in self.chain[i].buffers()]

    def undo(self, saved: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Put back the buffers of :meth:`save_buffers` and drop the gradients: a refused
        round leaves no trace."""
        with torch.no_grad():
            for b, value in saved:
                b.copy_(value)
        if self.opt is not None:
            self.opt.zero_grad(set_to_none=True)

    def snapshot(self, elements: Iterable[int],
                 buffers: list[tuple[torch.Tensor, torch.Tensor]]) -> Snapshot:
        """Copies of what :meth:`update` of ``elements`` changes, so that it can be taken back;
        ``buffers`` from :meth:`save_buffers` before the forward pass."""
        params = [p for i in elements for p in self.chain[i].parameters()]
        state = self.opt.state if self.opt is not None else {}
        momentum = [(p, state.get(p, {}).get("momentum_buffer")) for p in params]
        return Snapshot([(p, p.detach().clone()) for p in params],
                         [(p, None if b is None else b.clone()) for p, b in momentum],
                         buffers, set(self.trained))

    def restore(self, snapshot: Snapshot) -> None:
        """Take an update back: afterwards parameters, momentum, buffers and the trained set
        are bit-identical to the :meth:`snapshot`."""
        with torch.no_grad():
            for p, value in snapshot.params:
                p.copy_(value)
        if self.opt is not None:
            for p, buf in snapshot.momentum:
                if buf is None:
                    self.opt.state.pop(p, None)
                else:
                    self.opt.state[p]["momentum_buffer"] = buf
        self.undo(snapshot.buffers)
        self.trained = set(snapshot.trained)

    def backward(self, start: torch.Tensor, grad: torch.Tensor | None) -> str | None:
        """Back-propagate from ``start`` (with ``grad``, or a scalar loss); why the gradients
        cannot be applied (not finite), or None."""
        if self.opt is not None:
            self.opt.zero_grad(set_to_none=True)
        if start.requires_grad:
            start.backward(grad)
        if any(p.grad is not None and not bool(torch.isfinite(p.grad).all())
               for p in self.params):
            return "gradient"
        return None

    def update(self, elements: range) -> None:
        """Update only the parameters that got a gradient (SGD skips the others, momentum
        included)."""
        if self.opt is not None:
            self.opt.step()
        self.trained.update(elements)

    # -- syncing ---------------------------------------------------------------------------------
    def updates(self, indices: Iterable[int], other_trained: set[int]) -> dict[int, Update]:
        """What this side sends for each element of ``indices`` it trained: params - base if
        the other side trained it too, else the params themselves (= base + delta, exactly)."""
        result = {}
        for i in indices:
            if i in self.trained:
                both = i in other_trained
                result[i] = ({n: p.detach() - self.base[i][n] if both else p.detach().clone()
                              for n, p in self.chain[i].named_parameters()}, not both)
        return result

    def buffers(self, i: int) -> Tensors:
        """Element ``i``'s buffers and its optimizer momentum (``optim:<param>``): the state
        that only its owner keeps current, sent with it so training continues exactly."""
        state = {n: b.detach() for n, b in self.chain[i].named_buffers()}
        for name, p in self.chain[i].named_parameters():
            buf = self.opt.state.get(p, {}).get("momentum_buffer") if self.opt else None
            if buf is not None:
                state[OPTIM_PREFIX + name] = buf.detach()
        return state

    def merged(self, i: int, updates: Sequence[Update | None], buffers: Tensors | None
               ) -> Merged:
        """params = base + delta_device + delta_server (in that order on both sides, so the
        copies stay identical; one side's absolute params are taken as they are), computed
        into new tensors; raises WireError if the result is not finite."""
        sent = [u for u in updates if u is not None and u[0]]
        params = {}
        for name in dict(self.chain[i].named_parameters()):
            base = self.base[i][name]
            if len(sent) == 1 and sent[0][1]:
                new = sent[0][0][name].clone()
            else:
                new = base.clone()
                for values, absolute in sent:
                    new += values[name] - base if absolute else values[name]
            check_finite(new, f"element {i} parameter {name!r} after the merge")
            params[name] = new
        return Merged(params, buffers)

    def apply(self, i: int, merged: Merged) -> None:
        """Take a merge's result: parameters and base, and the owner's buffers and momentum
        when sent (no momentum sent: the owner has none)."""
        with torch.no_grad():
            for name, p in self.chain[i].named_parameters():
                p.copy_(merged.params[name])
                self.base[i][name] = merged.params[name]
            if merged.buffers is not None:
                for name, b in self.chain[i].named_buffers():
                    if name in merged.buffers:
                        b.copy_(merged.buffers[name])
        if merged.buffers is not None and self.opt is not None:
            for name, p in self.chain[i].named_parameters():
                buf = merged.buffers.get(OPTIM_PREFIX + name)
                if buf is None:
                    self.opt.state.pop(p, None)
                else:
                    self.opt.state[p]["momentum_buffer"] = buf.clone()
        self.trained.discard(i)


"""Split (collaborative) training as in L2S (paper 002, Sec. III-A and III-C), run in-process.

How training partitions are obtained. The LayerGraph programs are *inference* programs
(exported in eval mode, parameters frozen, batch-norm using running statistics), so they cannot
be trained. Instead we split the ``nn.Module`` itself: the model is given as a *chain* of modules
(an ``nn.Sequential``, a module with a ``layers()`` method, or any model torch.fx can trace, cut
at its single-tensor points, see :func:`as_chain`), and the device/server parts are
``nn.Sequential`` slices of it. Batch-norm runs in train mode on whichever side holds it,
exactly as in unsplit training. Cut indices use
the LayerGraph convention over the chain: cut i = after chain element i, -1 = before the first
(p = i + 1 in the paper); :func:`graph_cut_for_chain` maps them onto a captured graph.

One round (:meth:`SplitTrainer.step`) follows the paper's protocol: the device runs the front
forward and "sends" the activation and labels; the server runs the back forward and backward,
updates its weights and "returns" the gradient at the cut; the device finishes the backward
pass and updates its weights. Bytes up/down are counted at the tensors' own dtypes.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from edgesplit.errors import ConfigError
from edgesplit.train.chain import chain_from_trace

__all__ = [
    "OptimizerFactory",
    "SplitTrainer",
    "StepStats",
    "SyncReport",
    "as_chain",
    "element_seed",
    "graph_cut_for_chain",
    "seeded_forward",
    "tensor_bytes",
]

OptimizerFactory = Callable[[list[nn.Parameter]], torch.optim.Optimizer]
LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def tensor_bytes(t: torch.Tensor) -> int:
    """Bytes of ``t`` on the wire at its own dtype."""
    return t.numel() * t.element_size()


@dataclass(frozen=True)
class StepStats:
    """One training round: the loss and what crossed the link."""

    loss: float
    bytes_up: int    # activation + labels, device -> server (psi_p^f)
    bytes_down: int  # gradient at the cut, server -> device (psi_p^b)


@dataclass(frozen=True)
class SyncReport:
    """What moving the cut makes one side send to the other (paper Fig. 5)."""

    old_cut: int
    new_cut: int
    moved: tuple[int, ...]      # chain indices of the layers that changed sides
    to_device: bool             # True: server -> device (cut moved later)
    weight_bytes: int           # trained parameters of the moved layers (what the paper syncs)
    buffer_bytes: int           # e.g. batch-norm running statistics, needed as well
    optimizer_state_bytes: int  # momentum / Adam moments kept with the moved parameters

    @property
    def total_bytes(self) -> int:
        return self.weight_bytes + self.buffer_bytes + self.optimizer_state_bytes


def as_chain(model: nn.Module) -> list[nn.Module]:
    """The modules of ``model`` in execution order, such that applying them in turn is
    ``model(x)``: an ``nn.Sequential``'s modules, a ``layers()`` method's list, or else the
    model's forward traced and cut wherever one tensor crosses (:func:`chain_from_trace`);
    a model torch.fx cannot trace, or that is not one tensor in and out, raises ConfigError."""
    if isinstance(model, nn.Sequential):
        return list(model)
    layers = getattr(model, "layers", None)
    if callable(layers):
        return list(layers())
    return chain_from_trace(model)


def element_seed(seed: int, round_: int, element: int) -> int:
    """The RNG seed of chain element ``element`` in training round ``round_`` (1-based) of a
    run seeded with ``seed``."""
    digest = hashlib.blake2b(f"{seed}:{round_}:{element}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def seeded_forward(chain: Sequence[nn.Module], lo: int, hi: int, x: torch.Tensor, seed: int,
                   round_: int) -> torch.Tensor:
    """``chain[lo:hi]`` applied to ``x``, each element drawing its random numbers (dropout,
    drop-connect) from :func:`element_seed`: a round draws the same masks whether its elements
    run in one process or on both sides of a cut, so split training equals unsplit training
    for models with dropout too. The caller's CPU random state is left as it was."""
    with torch.random.fork_rng(devices=[]):
        for i in range(lo, hi):
            torch.manual_seed(element_seed(seed, round_, i))
            x = chain[i](x)
    return x


def graph_cut_for_chain(graph, chain_cut: int) -> int:
    """The LayerGraph cut index equal to chain cut ``chain_cut``, for a graph captured from
    ``capturable(chain)`` or ``nn.Sequential(*chain)`` of modules, not GraphModules (its
    layers' module paths start with the chain index). Chain elements without a graph layer (a
    fused flatten) map to the preceding layer's cut."""
    last = -1
    for layer in graph.layers:
        head = layer.module_path.split(".")[0]
        if head.isdigit() and int(head) <= chain_cut:
            last = max(last, layer.index)
    return last


def _params(modules: Iterable[nn.Module]) -> list[nn.Parameter]:
    # a parameter shared by several modules must appear once in an optimizer
    seen: dict[int, nn.Parameter] = {}
    for module in modules:
        for p in module.parameters():
            if p.requires_grad:
                seen.setdefault(id(p), p)
    return list(seen.values())


def _state_bytes(state: dict) -> int:
    return sum(tensor_bytes(v) for v in state.values() if isinstance(v, torch.Tensor))


class SplitTrainer:
    """Train a chain of modules split at ``cut`` between an end device and an edge server.

    ``device_optimizer``/``server_optimizer`` build an optimizer from a parameter list (the
    server defaults to the device's factory); a side with no trainable parameters gets none.
    """

    def __init__(self, layers: nn.Module | Sequence[nn.Module], cut: int, loss_fn: LossFn,
                 device_optimizer: OptimizerFactory,
                 server_optimizer: OptimizerFactory | None = None) -> None:
        self.layers: list[nn.Module] = as_chain(layers) if isinstance(layers, nn.Module) \
            else list(layers)
        if not self.layers:
            raise ConfigError("cannot split an empty chain of layers")
        self.loss_fn = loss_fn
        self._factories = (device_optimizer, server_optimizer or device_optimizer)
        self.cut = self._check_cut(cut)
        self.device_opt, self.server_opt = self._build_optimizers({})

    @classmethod
    def from_parts(cls, front: nn.Module | Sequence[nn.Module],
                   back: nn.Module | Sequence[nn.Module], loss_fn: LossFn,
                   device_optimizer: OptimizerFactory,
                   server_optimizer: OptimizerFactory | None = None) -> SplitTrainer:
        """Start from an explicit front (device) and back (server) chain."""
        f = as_chain(front) if isinstance(front, nn.Module) else list(front)
        b = as_chain(back) if isinstance(back, nn.Module) else list(back)
        return cls([*f, *b], len(f) - 1, loss_fn, device_optimizer, server_optimizer)

    # ---- structure -----------------------------------------------------------------------
    def _check_cut(self, cut: int) -> int:
        n = len(self.layers)
        if isinstance(cut, bool) or not isinstance(cut, int) or not -1 <= cut <= n - 1:
            raise ConfigError(f"cut {cut!r} is not valid for a chain of {n} layers: allowed are "
                              f"-1 (all on the server) to {n - 1} (all on the device)")
        return cut

    @property
    def front(self) -> nn.Sequential:
        """Layers on the end device (DNN_p^front)."""
        return nn.Sequential(*self.layers[:self.cut + 1])

    @property
    def back(self) -> nn.Sequential:
        """Layers on the edge server (DNN_p^back)."""
        return nn.Sequential(*self.layers[self.cut + 1:])

    def _build_optimizers(self, states: dict[int, dict]
                          ) -> tuple[torch.optim.Optimizer | None, torch.optim.Optimizer | None]:
        """Fresh optimizers for both sides, seeded with the per-parameter ``states`` (by id)."""
        result = []
        for factory, part in zip(self._factories, (self.front, self.back), strict=True):
            params = _params(part)
            opt = factory(params) if params else None  # torch rejects empty parameter lists
            if opt is not None:
                for p in params:
                    if id(p) in states:
                        opt.state[p] = states[id(p)]
            result.append(opt)
        return result[0], result[1]

    # ---- one round -----------------------------------------------------------------------
    def step(self, x: torch.Tensor, y: torch.Tensor) -> StepStats:
        """One training round on batch (x, y) following the L2S protocol."""
        front, back = self.front.train(), self.back.train()
        if len(back) == 0:  # p = P: pure on-device training, nothing crosses the link
            loss = self.loss_fn(front(x), y)
            _update(self.device_opt, loss)
            return StepStats(float(loss.detach()), 0, 0)
        # device: front forward (the identity at p = 0: the raw input is sent)
        activation = front(x)
        # "send": the server gets a copy outside the device's autograd graph; it needs the
        # gradient at the cut only if the device has something to train with it
        needs_grad = activation.requires_grad
        received = activation.detach().clone().requires_grad_(needs_grad)
        bytes_up = tensor_bytes(received) + tensor_bytes(y)
        # server: back forward, backward, update; the cut gradient is computed before the
        # update, so updating first (as in the paper) does not change it
        loss = self.loss_fn(back(received), y)
        _update(self.server_opt, loss)
        if not needs_grad:
            return StepStats(float(loss.detach()), bytes_up, 0)
        grad = received.grad.detach().clone()  # "returned" to the device
        # device: finish the backward pass and update
        if self.device_opt is not None:
            self.device_opt.zero_grad()
        activation.backward(grad)
        if self.device_opt is not None:
            self.device_opt.step()
        return StepStats(float(loss.detach()), bytes_up, tensor_bytes(grad))

    # ---- re-partitioning -----------------------------------------------------------------
    def move_cut(self, new_cut: int) -> SyncReport:
        """Move the partition point, keeping every layer's trained weights.

        The layers between the old and the new cut change sides with their parameters and
        buffers (in-process the module objects simply change owner; on a real link these are
        the bytes to send). Per-parameter optimizer state (momentum, Adam moments and step)
        moves with them, so training continues exactly as if never split; optimizer
        hyper-parameters come from each side's factory.
        """
        new_cut = self._check_cut(new_cut)
        old = self.cut
        lo, hi = sorted((old, new_cut))
        moved = tuple(range(lo + 1, hi + 1))
        states = self._collect_states()
        moved_params = _params(self.layers[i] for i in moved)
        report = SyncReport(
            old_cut=old, new_cut=new_cut, moved=moved, to_device=new_cut > old,
            weight_bytes=sum(tensor_bytes(p) for p in moved_params),
            buffer_bytes=sum(tensor_bytes(b) for i in moved for b in self.layers[i].buffers()),
            optimizer_state_bytes=sum(_state_bytes(states.get(id(p), {})) for p in moved_params),
        )
        self.cut = new_cut
        self.device_opt, self.server_opt = self._build_optimizers(states)
        return report

    def _collect_states(self) -> dict[int, dict]:
        states: dict[int, dict] = {}
        for opt in (self.device_opt, self.server_opt):
            if opt is not None:
                states.update((id(p), s) for p, s in opt.state.items())
        return states

    def parameters(self) -> Iterator[nn.Parameter]:
        """Every trainable parameter of the whole chain, once."""
        return iter(_params(self.layers))


def _update(opt: torch.optim.Optimizer | None, loss: torch.Tensor) -> None:
    """zero_grad, backward, step (a side without parameters only back-propagates)."""
    if opt is not None:
        opt.zero_grad()
    if loss.requires_grad:  # nothing trainable anywhere: there is nothing to back-propagate
        loss.backward()
    if opt is not None:
        opt.step()

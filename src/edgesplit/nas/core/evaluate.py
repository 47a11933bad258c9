"""How every NAS system measures a network: top-1 accuracy and batch-norm recalibration.

A supernet's batch-norm running statistics mix every path that ran through a layer, so a
sub-network evaluated with them scores near chance; once-for-all re-estimates them for each
sub-network before measuring it, and so does every system here (:func:`recalibrate_bn`: a
cumulative average over a few batches, no weight changes). Accuracy is then counted batch by
batch without autograd (:func:`top1_accuracy`); :func:`top1` is the same comparison per
sample, for an evaluator that averages its own scores.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import torch
from torch import nn

__all__ = ["recalibrate_bn", "top1", "top1_accuracy"]

Net = TypeVar("Net", bound=nn.Module)


def top1(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Per-sample 1.0 / 0.0: does the arg-max class equal the target class."""
    return (outputs.argmax(-1) == targets).to(torch.float32)


def top1_accuracy(predict: Callable[[torch.Tensor], torch.Tensor], inputs: torch.Tensor,
                  labels: torch.Tensor, batch_size: int) -> float:
    """Top-1 accuracy in % of ``predict`` (a batch of ``inputs`` as stored -> logits, wherever
    it computes) on labelled ``inputs``, ``batch_size`` samples at a time."""
    correct = 0
    with torch.no_grad():
        for start in range(0, len(inputs), batch_size):
            logits = predict(inputs[start:start + batch_size])
            target = labels[start:start + batch_size].to(logits.device)
            correct += int((logits.argmax(-1) == target).sum())
    return 100.0 * correct / len(inputs)


def recalibrate_bn(net: Net, batches: Iterable[Any], run: Callable[[Any], object] | None = None,
                   norms: Iterable[nn.modules.batchnorm._BatchNorm] | None = None) -> Net:
    """``net`` with the running statistics of its batch-norms (``norms``: all of them by
    default) re-estimated as a cumulative average over ``batches``, each passed to ``run``
    (``net`` itself by default); their momenta are restored after. Returns ``net`` in eval
    mode."""
    if norms is None:
        norms = (m for m in net.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm))
    momenta = [(bn, bn.momentum) for bn in norms]
    for bn, _ in momenta:
        bn.reset_running_stats()
        bn.momentum = None  # a cumulative moving average over the batches below
    net.train()
    with torch.no_grad():
        for batch in batches:
            (run or net)(batch)
    for bn, momentum in momenta:
        bn.momentum = momentum
    return net.eval()

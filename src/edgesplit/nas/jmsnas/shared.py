"""A mixed op whose MBConv candidates share their convolution weights (once-for-all style).

With one weight set per candidate (ProxylessNAS, :class:`~edgesplit.nas.jmsnas.supernet.MixedOp`),
channel c of one candidate's output has nothing to do with channel c of another's at the start,
so a layer after a randomly sampled path sees inputs whose meaning changes every step. On the
digits, uniform sampling over the 13 JMSNAS candidates left the supernet at chance after 200
steps while any fixed architecture learned in 20; two candidates per layer already slowed it
tenfold. Sharing the weights aligns the candidates' channels from the first step.

Every MBConv candidate of a layer slices one set of weights, as once-for-all does:

- expand 1x1: the first ``in_ch * e`` output channels of the widest expansion;
- depthwise: the centre ``k x k`` of the largest kernel, over the same channels;
- project 1x1: the first ``in_ch * e`` input channels.

Batch-norms are per (kernel, expansion), since their statistics differ between candidates
(switchable batch-norm, as in slimmable networks); a candidate with and without shortcut shares
everything. Identity runs nothing. The binary gates of JMSNAS apply unchanged: a layer runs one
or two candidates, whichever weights they slice. :meth:`SharedMixedOp.candidate_state` gives a
candidate's weights as the state dict of a plain :class:`~edgesplit.nas.core.ops.MBConv`, which is
how an extracted network gets them.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from edgesplit.nas.core.ops import OpSpec
from edgesplit.nas.jmsnas.paths import PathChoice

__all__ = ["SharedMixedOp"]


def _bn_key(op: OpSpec) -> str:
    return f"k{op.kernel}_e{op.expand}"


class SharedMixedOp(PathChoice):
    """The candidates ``ops`` of one layer over one shared weight set."""

    def __init__(self, in_ch: int, out_ch: int, stride: int, ops: Sequence[OpSpec]) -> None:
        super().__init__(ops)
        convs = [op for op in self.specs if not op.is_identity]
        self.stride = stride
        self.in_ch = in_ch
        self.kmax = max((op.kernel for op in convs), default=1)
        hidden = max((in_ch * op.expand for op in convs), default=in_ch)
        self.expand_weight = nn.Parameter(torch.empty(hidden, in_ch, 1, 1))
        self.depthwise_weight = nn.Parameter(torch.empty(hidden, 1, self.kmax, self.kmax))
        self.project_weight = nn.Parameter(torch.empty(out_ch, hidden, 1, 1))
        for w in (self.expand_weight, self.depthwise_weight, self.project_weight):
            nn.init.kaiming_normal_(w, mode="fan_out")
        # Flat keys "k3_e6__project_bn" (module names may not contain dots).
        self.bns = nn.ModuleDict()
        for op in convs:
            width = in_ch * op.expand
            for name, channels in (("expand_bn", width), ("depthwise_bn", width),
                                   ("project_bn", out_ch)):
                self.bns[f"{_bn_key(op)}__{name}"] = nn.BatchNorm2d(channels)

    def run_path(self, index: int, x: torch.Tensor) -> torch.Tensor:
        op = self.specs[index]
        if op.is_identity:
            return x
        weights = self._weights(op)
        y = x
        if "expand" in weights:
            y = F.relu6(self._bn(op, "expand_bn")(F.conv2d(y, weights["expand"])))
        y = F.conv2d(y, weights["depthwise"], stride=self.stride, padding=op.kernel // 2,
                     groups=weights["depthwise"].shape[0])
        y = F.relu6(self._bn(op, "depthwise_bn")(y))
        y = self._bn(op, "project_bn")(F.conv2d(y, weights["project"]))
        return x + y if op.shortcut else y

    def _bn(self, op: OpSpec, name: str) -> nn.Module:
        return self.bns[f"{_bn_key(op)}__{name}"]

    def _weights(self, op: OpSpec) -> dict[str, torch.Tensor]:
        hidden = self.in_ch * op.expand
        lo = (self.kmax - op.kernel) // 2
        found = {"depthwise": self.depthwise_weight[:hidden, :, lo:lo + op.kernel,
                                                    lo:lo + op.kernel],
                 "project": self.project_weight[:, :hidden]}
        if op.expand != 1:  # MBConv drops the expand convolution at expansion 1
            found["expand"] = self.expand_weight[:hidden]
        return found

    def candidate_state(self, index: int) -> dict[str, torch.Tensor]:
        """Candidate ``index``'s weights, keyed as the state dict of a plain MBConv."""
        op = self.specs[index]
        if op.is_identity:
            return {}
        state = {f"{name}.weight": w.detach().clone().contiguous()
                 for name, w in self._weights(op).items()}
        names = ("depthwise_bn", "project_bn") if op.expand == 1 else (
            "expand_bn", "depthwise_bn", "project_bn")
        for name in names:
            for key, value in self._bn(op, name).state_dict().items():
                state[f"{name}.{key}"] = value.clone()
        return state

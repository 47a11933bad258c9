"""Measure what :mod:`edgesplit.llm.model.description` counts, on a real transformers model: each
block's parameter bytes, the KV cache a forward pass leaves, and each block's FLOPs in a
phase. The tests hold the analytic description to these; the LLM runtime can use the cache
measure for its session accounting."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from edgesplit.llm.model.description import CausalLM

__all__ = ["measured_block_flops", "measured_kv_bytes", "measured_param_bytes"]


def _owner(lm: CausalLM, name: str) -> list[str]:
    """The blocks whose modules hold the parameter or module ``name`` (dotted path)."""
    return [block.name for block in lm.blocks
            if any(name == m or name.startswith(m + ".") for m in block.modules)]


def measured_param_bytes(module: nn.Module, lm: CausalLM) -> dict[str, int]:
    """Bytes of every parameter under each block's modules, at ``lm.dtype``. A tied weight
    counts in every block that uses it (as each stage holding one would store it). Raises
    ValueError for a parameter no block owns: the description would miss it."""
    found = dict.fromkeys((b.name for b in lm.blocks), 0)
    for name, param in module.named_parameters(remove_duplicate=False):
        owners = _owner(lm, name)
        if not owners:
            raise ValueError(f"parameter {name!r} belongs to no block of {lm.name}")
        for owner in owners:
            found[owner] += param.numel() * lm.dtype_bytes
    return found


def measured_kv_bytes(cache: Any) -> list[int]:
    """Bytes of the keys and values each layer of a transformers cache holds
    (``DynamicCache``: one entry per decoder block)."""
    return [sum(t.numel() * t.element_size() for t in (layer.keys, layer.values)
                if t is not None) for layer in cache.layers]


def measured_block_flops(module: nn.Module, lm: CausalLM, run: Callable[[], Any]
                         ) -> dict[str, int]:
    """FLOPs of each block while ``run()`` calls ``module``, by torch's FLOP counter (matrix
    products; attention counts only through its matmuls, so use the eager implementation).
    A module nested in a block counts once, with the block."""
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with torch.no_grad(), counter:
        run()
    counts = counter.get_flop_counts()
    root = type(module).__name__ + "."
    found = dict.fromkeys((b.name for b in lm.blocks), 0)
    for path, per_op in counts.items():
        if not path.startswith(root):
            continue
        name = path[len(root):]
        # count the block's own top module only (its children are included in it)
        for block in lm.blocks:
            if name in block.modules:
                found[block.name] += int(sum(per_op.values()))
    return found

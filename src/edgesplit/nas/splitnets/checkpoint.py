"""A trained SplitNets supernet in a folder, without pickle: ``supernet.json`` (format, the
whole space, the initialisation, how it was trained) and ``supernet.safetensors``.

Stage 2 (the search) loads it and may run again for another hardware configuration without
retraining (appendix H). The folder is the checkpoint layout every NAS system shares
(:mod:`edgesplit.nas.core.checkpoint`): loading checks the files and names the file and what
is wrong with it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from edgesplit.nas.core.checkpoint import CheckpointFormat
from edgesplit.nas.splitnets.space import SplitSpace
from edgesplit.nas.splitnets.supernet import SplitSupernet

__all__ = ["SUPERNET_FILE", "SUPERNET_WEIGHTS", "load_supernet", "save_supernet"]

FORMAT = "edgesplit.nas.splitnets.supernet/1"
SUPERNET_FILE = "supernet.json"
SUPERNET_WEIGHTS = "supernet.safetensors"
SUPERNET = CheckpointFormat(FORMAT, SUPERNET_FILE, SUPERNET_WEIGHTS, "trained supernet",
                            "train one with `edgesplit nas splitnets train --out DIR`",
                            "save them together with save_supernet")


def save_supernet(folder: str | Path, supernet: SplitSupernet,
                  training: dict[str, Any] | None = None) -> Path:
    """Write ``supernet`` and a summary of its ``training`` into ``folder``."""
    doc = {"space": supernet.space.to_dict(), "init": supernet.init, "training": training or {}}
    return SUPERNET.save(folder, doc, _own_state(supernet))


def read_supernet_doc(folder: str | Path) -> dict[str, Any]:
    return SUPERNET.read(folder)


def load_supernet(folder: str | Path) -> tuple[SplitSupernet, dict[str, Any]]:
    """The supernet saved in ``folder`` (eval mode) and its ``supernet.json`` document."""
    doc = read_supernet_doc(folder)
    space = SplitSpace.from_dict(doc.get("space", {}))
    supernet = SplitSupernet(space, init=str(doc.get("init", "split-aware")))
    state = SUPERNET.load_state(folder, _own_state(supernet), fits="space")
    supernet.load_state_dict(state, strict=False)  # agg_blocks of one view = blocks
    return supernet.eval(), doc


def _own_state(supernet: SplitSupernet) -> dict[str, torch.Tensor]:
    """The state dict without aliases: a single-view supernet's aggregator blocks *are* its
    sensor blocks, and safetensors refuses to store one tensor twice."""
    shared = supernet.agg_blocks is supernet.blocks
    return {k: v.contiguous() for k, v in supernet.state_dict().items()
            if not (shared and k.startswith("agg_blocks."))}

"""A trained SplitNets supernet in a folder, without pickle: ``supernet.json`` (format, the
whole space, the initialisation, how it was trained) and ``supernet.safetensors``.

Stage 2 (the search) loads it and may run again for another hardware configuration without
retraining (appendix H). Loading checks the files before building anything and names the
file and what is wrong with it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from edgesplit.errors import ConfigError
from edgesplit.nas.core.files import read_document, write_json
from edgesplit.nas.splitnets.space import SplitSpace
from edgesplit.nas.splitnets.supernet import SplitSupernet

__all__ = ["SUPERNET_FILE", "SUPERNET_WEIGHTS", "load_supernet", "save_supernet"]

FORMAT = "edgesplit.nas.splitnets.supernet/1"
SUPERNET_FILE = "supernet.json"
SUPERNET_WEIGHTS = "supernet.safetensors"


def save_supernet(folder: str | Path, supernet: SplitSupernet,
                  training: dict[str, Any] | None = None) -> Path:
    """Write ``supernet`` and a summary of its ``training`` into ``folder``."""
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    save_file(_own_state(supernet), str(out / SUPERNET_WEIGHTS))
    doc = {"format": FORMAT, "space": supernet.space.to_dict(), "init": supernet.init,
           "training": training or {}}
    write_json(out / SUPERNET_FILE, doc)
    return out


def read_supernet_doc(folder: str | Path) -> dict[str, Any]:
    return read_document(folder, SUPERNET_FILE, what="trained supernet", expected_format=FORMAT,
                         fix="train one with `edgesplit nas splitnets train --out DIR`")


def load_supernet(folder: str | Path) -> tuple[SplitSupernet, dict[str, Any]]:
    """The supernet saved in ``folder`` (eval mode) and its ``supernet.json`` document."""
    doc = read_supernet_doc(folder)
    space = SplitSpace.from_dict(doc.get("space", {}))
    supernet = SplitSupernet(space, init=str(doc.get("init", "split-aware")))
    weights = Path(folder) / SUPERNET_WEIGHTS
    if not weights.is_file():
        raise ConfigError(f"{weights} is missing; the folder is incomplete")
    try:
        state = load_file(str(weights))
    except (SafetensorError, OSError) as exc:
        raise ConfigError(f"{weights} is not a readable safetensors file ({exc})") from None
    expected = _own_state(supernet)
    missing, unexpected = sorted(set(expected) - set(state)), sorted(set(state) - set(expected))
    wrong = [k for k in expected if k in state and state[k].shape != expected[k].shape]
    if missing or unexpected or wrong:
        raise ConfigError(f"{weights} does not fit the space in {SUPERNET_FILE}: missing "
                          f"{missing[:3]}, unexpected {unexpected[:3]}, other shapes "
                          f"{wrong[:3]}; save them together with save_supernet")
    supernet.load_state_dict(state, strict=False)  # agg_blocks of one view = blocks
    return supernet.eval(), doc


def _own_state(supernet: SplitSupernet) -> dict[str, torch.Tensor]:
    """The state dict without aliases: a single-view supernet's aggregator blocks *are* its
    sensor blocks, and safetensors refuses to store one tensor twice."""
    shared = supernet.agg_blocks is supernet.blocks
    return {k: v.contiguous() for k, v in supernet.state_dict().items()
            if not (shared and k.startswith("agg_blocks."))}

"""An elastified supernet in a folder, without pickle: ``supernet.json`` (format, where the
model came from, the elastification options, the space, the blocks, how it was trained) and
``supernet.safetensors`` (the added branches' weights only), in the checkpoint layout every NAS
system shares (:mod:`edgesplit.nas.core.checkpoint`).

The pretrained blocks are not stored twice: loading captures the model again from its source
(a built-in name or the user's code and an input shape, or a ``.pt2`` file checked by its
SHA-256), elastifies it
with the saved options, checks that this gives the saved space, then loads the added weights.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from edgesplit.errors import ConfigError
from edgesplit.nas.adaptivenet.elastify import ElasticConfig, elastify
from edgesplit.nas.adaptivenet.space import ElasticSpace
from edgesplit.nas.adaptivenet.supernet import ElasticSupernet
from edgesplit.nas.core.checkpoint import CheckpointFormat

__all__ = ["SUPERNET_FILE", "SUPERNET_WEIGHTS", "build_supernet", "load_supernet",
           "model_source", "save_supernet"]

FORMAT = "edgesplit.nas.adaptivenet.supernet/1"
SUPERNET_FILE = "supernet.json"
SUPERNET_WEIGHTS = "supernet.safetensors"
SUPERNET = CheckpointFormat(
    FORMAT, SUPERNET_FILE, SUPERNET_WEIGHTS, "elastified supernet",
    "make one with `edgesplit nas adaptivenet elastify MODEL --out DIR`",
    "save them together with save_supernet")


def model_source(model: str, input_shape: Sequence[int] | None = None) -> dict[str, Any]:
    """How to capture ``model`` again: a built-in name or the user's code (``my_net.py:MyNet``,
    its file made absolute) and the input shape, or a ``.pt2`` file with its SHA-256."""
    from edgesplit.graph import is_code_ref, is_model_file, resolve_code_ref

    if is_code_ref(model):
        model = resolve_code_ref(model)
    path = Path(model)
    if is_model_file(model):
        if not path.is_file():
            raise ConfigError(f"model file {model} does not exist (pass a built-in model name "
                              "or a .pt2 file saved with torch.export.save)")
        return {"file": str(path.resolve()), "sha256": _sha256(path)}
    return {"model": model, "input_shape": list(input_shape) if input_shape else None}


def _capture(source: dict[str, Any]) -> Any:
    from edgesplit.graph import capture

    if "file" in source:
        path = Path(source["file"])
        if not path.is_file():
            raise ConfigError(f"the supernet was elastified from {path}, which is gone; "
                              "put the file back or elastify again")
        if _sha256(path) != source.get("sha256"):
            raise ConfigError(f"{path} changed since the supernet was elastified from it "
                              "(SHA-256 differs); elastify it again")
        return capture(path)
    shape = source.get("input_shape")
    return capture(str(source["model"]), input_shape=tuple(shape) if shape else None)


def _sha256(path: Path) -> str:
    """The file's SHA-256, streamed: a model file is checked for size only when captured."""
    with open(path, "rb") as file:
        return hashlib.file_digest(file, "sha256").hexdigest()


def build_supernet(model: str, *, input_shape: Sequence[int] | None = None,
                   config: ElasticConfig | None = None) -> ElasticSupernet:
    """Capture ``model`` (built-in name, ``my_net.py:MyNet`` or ``.pt2`` file) and elastify
    it."""
    source = model_source(model, input_shape)
    return elastify(_capture(source), config, source=source)


def save_supernet(folder: str | Path, supernet: ElasticSupernet,
                  training: dict[str, Any] | None = None) -> Path:
    """Write ``supernet`` (its added weights and how to rebuild the rest) into ``folder``."""
    if not supernet.meta.get("source"):
        raise ConfigError("this supernet does not know its model's source; build it with "
                          "build_supernet (or elastify(..., source=model_source(...)))")
    doc = {"space": supernet.space.to_dict(), "training": training or {},
           **{k: v for k, v in supernet.meta.items() if k != "space"}}
    return SUPERNET.save(folder, doc, added_state(supernet))


def added_state(supernet: ElasticSupernet) -> dict[str, torch.Tensor]:
    """The added branches' parameters by state-dict name (what training changed)."""
    return {name: p.detach().contiguous() for name, p in supernet.named_parameters()}


def read_supernet_doc(folder: str | Path) -> dict[str, Any]:
    return SUPERNET.read(folder)


def load_supernet(folder: str | Path) -> tuple[ElasticSupernet, dict[str, Any]]:
    """The supernet saved in ``folder`` (eval mode) and its ``supernet.json`` document."""
    doc = read_supernet_doc(folder)
    try:
        config = ElasticConfig(**doc["config"])
        saved = ElasticSpace.from_dict(doc["space"])
        source = dict(doc["source"])
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError(f"{Path(folder) / SUPERNET_FILE} is incomplete ({exc}); elastify "
                          "the model again") from None
    supernet = elastify(_capture(source), config, source=source)
    if supernet.space != saved:
        raise ConfigError(f"elastifying {source} again gives another space than the one in "
                          f"{SUPERNET_FILE} (a different edgesplit or model?); elastify again")
    state = SUPERNET.load_state(folder, added_state(supernet), fits="supernet")
    supernet.load_state_dict(state, strict=False)
    supernet.meta["training"] = doc.get("training", {})
    return supernet.eval(), doc

"""Reading ``.pt2`` model files without running code hidden in them.

``torch.export.load`` (torch 2.13, ``torch/export/pt2_archive/_package.py``) unpickles parts of
the archive, and unpickling runs whatever the file's author put there:

- weights and tensor constants whose payload config says ``use_pickle`` (tensor subclasses) go
  through ``torch.load(..., weights_only=False)``;
- constants that are objects: ``custom_obj_*`` (TorchScript pickler) and ``opaque_obj_*``
  (``pickle.loads``);
- the sample inputs (``data/sample_inputs/<model>.pt``, in every archive) and legacy weight or
  constant files (``data/weights/<model>.pt``) go through ``torch.load(weights_only=True)`` and,
  when that refuses them, again with ``weights_only=False``;
- an archive torch cannot read in the current format is retried as the pre-2.8 zip format
  (a top-level ``version`` entry), whose state dict is unpickled the same way;
- AOTInductor packages (``data/aotinductor/``) are shared libraries that get loaded.

The graph itself is JSON, and the verifier torch runs on load refuses call targets that are
not operators. So an archive is safe to load when none of the above is in it and its sample
inputs load with ``weights_only=True``: :func:`unsafe_payloads` checks exactly that, on the
same bytes that are then given to torch (no window for the file to change in between).
"""

from __future__ import annotations

import importlib
import io
import json
import zipfile
from pathlib import Path

import torch

from edgesplit.errors import CaptureError, option

__all__ = ["TrustedModelFile", "read_model_file", "register_spec_types", "unsafe_payloads"]

# Packages whose output types (transformers' ModelOutput classes) edgesplit imports on its own
# to rebuild a saved program's output structure; other packages only for a trusted file.
_KNOWN_PACKAGES = ("transformers",)

_OBJECT_PREFIXES = ("custom_obj_", "opaque_obj_")  # TorchScript pickler, pickle.loads


class TrustedModelFile(str):
    """A model file path the user vouched for (``--trust-model-file``): it behaves as the path
    everywhere (plans store it as one), and :func:`edgesplit.graph.capture` loads it even when
    it holds pickled payloads. Code that captures the model again (planners, the runtime)
    inherits the decision by being handed this object instead of the plain path."""

    __slots__ = ()


def read_model_file(path: str | Path) -> bytes:
    """The file's bytes: checked and loaded from memory, so both see the same content."""
    return Path(path).read_bytes()


def unsafe_payloads(data: bytes) -> list[str]:
    """What loading ``data`` with ``torch.export.load`` would unpickle or execute, one short
    description each; empty when the archive holds only raw tensors and JSON."""
    legacy = _legacy_zip_entries(data)
    if legacy:
        return legacy
    from torch.export.pt2_archive._package import PT2ArchiveReader

    try:
        archive = PT2ArchiveReader(io.BytesIO(data))
        names = archive.get_file_names()
    except Exception:  # not an archive at all: torch.export.load fails on it without unpickling
        return []
    found = [f"{n} (AOTInductor library)" for n in names if n.startswith("data/aotinductor/")]
    for model in _model_names(names):
        found += _pickled_in_config(archive, names, f"data/weights/{model}_weights_config.json")
        found += _pickled_in_config(archive, names, f"data/constants/{model}_constants_config.json")
        for name in (f"data/weights/{model}.pt", f"data/constants/{model}.pt",
                     f"data/sample_inputs/{model}.pt"):
            if name in names and not _loads_weights_only(archive.read_bytes(name)):
                found.append(f"{name} (a pickle torch.load refuses with weights_only=True)")
    return found


def register_spec_types(data: bytes, path: str, *, trusted: bool) -> None:
    """Make the pytree types the archive's input and output specs name known to torch.

    A program exported from a model returning, say, transformers' ``CausalLMOutputWithPast``
    stores that type by name; ``torch.export.load`` can only rebuild it when the class is
    registered, i.e. its module was imported (in a fresh ``edgesplit`` process it was not, and
    torch fails with "We ran into an error when deserializing"). Modules of known packages are
    imported here; any other only for a trusted file, since importing runs its code.
    """
    from torch.utils import _pytree as pytree

    for name in sorted(_spec_types(data) - set(pytree.SERIALIZED_TYPE_TO_PYTHON_TYPE)):
        module = name.rpartition(".")[0]
        if not (trusted or module.split(".")[0] in _KNOWN_PACKAGES):
            raise CaptureError(f"model file {path!r} returns or takes values of type {name}; "
                               f"to rebuild them edgesplit would import {module!r}, which runs "
                               f"its code: pass {option('trust_model_file', True)} if you "
                               "trust the file")
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise CaptureError(f"model file {path!r} uses type {name}, but {module!r} cannot "
                               f"be imported here ({exc}): install the package it comes from"
                               ) from None


def _spec_types(data: bytes) -> set[str]:
    """Type names in the module call graph's in/out specs (pytree JSON) of every program."""
    from torch.export.pt2_archive._package import PT2ArchiveReader

    try:
        archive = PT2ArchiveReader(io.BytesIO(data))
        names = archive.get_file_names()
        docs = [json.loads(archive.read_string(f"models/{m}.json")) for m in _model_names(names)]
    except Exception:
        return set()  # unreadable: torch.export.load says why
    found: set[str] = set()
    for doc in docs:
        for entry in doc.get("graph_module", {}).get("module_call_graph", []) or []:
            signature = (entry or {}).get("signature") or {}
            for key in ("in_spec", "out_spec"):
                if isinstance(signature.get(key), str):
                    found |= _types_in_spec(signature[key])
    return found


def _types_in_spec(text: str) -> set[str]:
    try:
        _, tree = json.loads(text)
    except (ValueError, TypeError):
        return set()
    found, stack = set(), [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            if isinstance(node.get("type"), str):
                found.add(node["type"])
            stack.extend(node.get("children_spec") or [])
    return found


def _legacy_zip_entries(data: bytes) -> list[str]:
    """torch.export.load falls back to the pre-2.8 format when the current reader fails, if the
    zip has a top-level ``version``; that format's state dict and constants are pickles."""
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as zf:
            names = zf.namelist()
    except zipfile.BadZipFile:
        return []
    if "version" not in names:
        return []
    return ["the whole archive (pre-2.8 torch.export format: " +
            ", ".join(n for n in names if n.endswith(".pt")) + ")"]


def _model_names(names: list[str]) -> list[str]:
    return [n[len("models/"):-len(".json")] for n in names
            if n.startswith("models/") and n.endswith(".json")]


def _pickled_in_config(archive, names: list[str], config_file: str) -> list[str]:
    if config_file not in names:
        return []
    try:
        config = json.loads(archive.read_string(config_file)).get("config", {})
    except (ValueError, AttributeError):
        return []  # torch fails to parse it too, before unpickling anything
    return [f"{fqn} ({config_file.rsplit('/', 1)[-1]}: pickled {meta.get('path_name')})"
            for fqn, meta in config.items() if isinstance(meta, dict) and _is_pickled(meta)]


def _is_pickled(meta: dict) -> bool:
    # torch picks the constant loader by file name, whatever use_pickle says
    path = str(meta.get("path_name", ""))
    return bool(meta.get("use_pickle")) or path.startswith(_OBJECT_PREFIXES)


def _loads_weights_only(blob: bytes) -> bool:
    if not blob:
        return True  # torch reads an empty payload as {} without unpickling
    try:
        torch.load(io.BytesIO(blob), weights_only=True)
    except Exception:
        return False
    return True

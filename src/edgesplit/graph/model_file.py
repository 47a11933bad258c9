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

Before any of that, :func:`read_model_file` bounds what the file may cost in memory
(:class:`ModelFileLimits`): the file's size and its zip directory (each entry's declared
inflated size, and their sum) are checked before the file is read whole or anything in it
inflated, so a zip bomb (a megabyte on disk, gigabytes inside) is refused at the cost of its
directory. The declared sizes are what every later read allocates: torch's reader (miniz)
inflates an entry into a buffer of its declared size and stops there, whatever the
compressed stream would go on to produce.
"""

from __future__ import annotations

import importlib
import io
import json
import os
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import torch

from edgesplit.errors import CaptureError, ConfigError, option
from edgesplit.units import parse_bytes

__all__ = ["MAX_MODEL_FILE_ENV", "ModelFileLimits", "TrustedModelFile", "read_model_file",
           "register_spec_types", "unsafe_payloads"]

MAX_MODEL_FILE_ENV = "EDGESPLIT_MAX_MODEL_FILE"
_MiB = 1 << 20
# how torch.export.save tells its archives apart from torch.save's and TorchScript's
_PT2_FORMAT_ENTRY = "archive_format"
_EXPORT_HOWTO = ("edgesplit reads a built-in model name (`edgesplit models` lists them), a "
                 "model in your own code (my_net.py:MyNet) or a .pt2 file: save one with "
                 "torch.export.save(torch.export.export(model, (example_input,)), 'model.pt2')")

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


@dataclass(frozen=True)
class ModelFileLimits:
    """How much memory reading a ``.pt2`` may take, checked on the file's size and its zip
    directory before anything is read whole or inflated.

    ``max_bytes`` bounds the file and the sum of its entries' inflated sizes (loading holds
    both in memory). ``max_ratio`` bounds how far the entries may inflate beyond the file's own
    size (past ``ratio_slack_bytes``, for small files): torch.export.save stores entries
    uncompressed, so a model inflates to about its size on disk and a file that inflates many
    times over is a zip bomb. The default ``max_bytes`` (16 GiB, room for models of billions
    of parameters) can be changed with the environment variable ``EDGESPLIT_MAX_MODEL_FILE``
    (e.g. ``64GiB``), which reaches every process that loads the file.
    """

    max_bytes: int = 16 << 30
    max_ratio: float = 4.0
    ratio_slack_bytes: int = 64 * _MiB

    def __post_init__(self) -> None:
        if self.max_bytes <= 0 or self.max_ratio < 1 or self.ratio_slack_bytes < 0:
            raise ConfigError(f"model file limits {self}: max_bytes must be positive, "
                              "max_ratio at least 1 and ratio_slack_bytes 0 or more")

    @classmethod
    def from_env(cls) -> ModelFileLimits:
        """The defaults, with ``max_bytes`` from ``EDGESPLIT_MAX_MODEL_FILE`` when it is set."""
        text = os.environ.get(MAX_MODEL_FILE_ENV)
        if not text:
            return cls()
        size = parse_bytes(text, MAX_MODEL_FILE_ENV)
        if not size:
            raise ConfigError(f"{MAX_MODEL_FILE_ENV}={text!r} must be a positive size, e.g. "
                              "32GiB")
        return cls(max_bytes=size)

    def inflated_bound(self, file_size: int) -> int:
        """The most a file of ``file_size`` bytes may hold once inflated."""
        return min(self.max_bytes, int(file_size * self.max_ratio) + self.ratio_slack_bytes)


def read_model_file(path: str | Path, limits: ModelFileLimits | None = None) -> bytes:
    """The file's bytes, read only once its size and zip directory are within ``limits``
    (default :meth:`ModelFileLimits.from_env`); CaptureError otherwise, or when the file is
    not a torch.export archive. The caller checks and loads these bytes from memory, so both
    see the same content; their directory is checked again, since the file may have changed
    while it was read."""
    limits = limits or ModelFileLimits.from_env()
    if not Path(path).is_file():
        raise CaptureError(f"model file {str(path)!r} does not exist: {_EXPORT_HOWTO}")
    with open(path, "rb") as file:
        size = os.fstat(file.fileno()).st_size
        _check_archive(str(path), file, size, limits)
        file.seek(0)
        data = file.read(size + 1)  # bounded by the size just checked, not by the limit
    if len(data) != size:
        raise CaptureError(f"model file {str(path)!r} changed while it was read: load it once "
                           "it is written completely")
    _check_archive(str(path), io.BytesIO(data), size, limits)
    return data


def _check_archive(path: str, source: BinaryIO, size: int, limits: ModelFileLimits) -> None:
    """Refuse a file over ``limits.max_bytes``, one that is not a torch.export archive, and
    one whose entries declare more inflated bytes than ``limits`` allow; reads only the zip
    directory (at the end of the file)."""
    if size > limits.max_bytes:
        raise CaptureError(f"model file {path!r} is {size} bytes, over the "
                           f"{limits.max_bytes} bytes a model file may take: if this "
                           f"machine has the memory, set {MAX_MODEL_FILE_ENV} to at least "
                           f"{_mib_up(size)}MiB")
    try:
        with zipfile.ZipFile(source) as archive:
            entries = archive.infolist()
    except (zipfile.BadZipFile, OSError, ValueError, EOFError):
        raise CaptureError(f"cannot read {path!r} as a torch.export program: it is not a zip "
                           f"archive; {_EXPORT_HOWTO}") from None
    _check_kind(path, [e.filename for e in entries])
    _check_inflated_sizes(path, entries, size, limits)


def _check_kind(path: str, names: list[str]) -> None:
    """A zip from torch.save or torch.jit.save (a ``.pt``) is not an exported program; the
    pre-2.8 export format (a top-level ``version``) is one, which :func:`unsafe_payloads`
    judges."""
    if "version" in names:
        return
    prefix = names[0].split("/", 1)[0] if names else ""
    if f"{prefix}/{_PT2_FORMAT_ENTRY}" not in names:
        raise CaptureError(f"cannot read {path!r} as a torch.export program: it is a zip "
                           "archive torch.export.save did not write (it has no archive_format "
                           f"entry: saved with torch.save or torch.jit.save?); {_EXPORT_HOWTO}")


def _check_inflated_sizes(path: str, entries: list[zipfile.ZipInfo], size: int,
                          limits: ModelFileLimits) -> None:
    bound = limits.inflated_bound(size)
    total = sum(e.file_size for e in entries)
    if total <= bound:
        return
    largest = max(entries, key=lambda e: e.file_size)
    what = (f"model file {path!r} would inflate to {_mib(total)} MiB ({largest.filename!r} "
            f"alone declares {_mib(largest.file_size)} MiB) from {_mib(size)} MiB on disk")
    if bound < limits.max_bytes:
        raise CaptureError(f"{what}, more than {limits.max_ratio:g} times its size: a zip "
                           "bomb, or an archive compressed after it was saved; re-save the "
                           "model with torch.export.save, which stores it uncompressed")
    raise CaptureError(f"{what}, over the {_mib(limits.max_bytes)} MiB a model file may take: "
                       f"if this machine has the memory, set {MAX_MODEL_FILE_ENV} to at least "
                       f"{_mib_up(total)}MiB")


def _mib(size: int) -> str:
    return f"{size / _MiB:.1f}"


def _mib_up(size: int) -> int:
    return -(-size // _MiB)  # rounded up: a limit named from it passes


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

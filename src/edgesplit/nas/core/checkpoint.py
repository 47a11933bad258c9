"""A network or supernet in a folder, without pickle: the checkpoint layout of every NAS system.

A folder holds a JSON document (its ``format``, ``name/version``, then what the system needs to
build the module again: a space, an architecture, how it was trained) and a safetensors file
of weights. :class:`CheckpointFormat` writes both, each whole or not at all, the weights first
and the document last, so a folder with a document has its weights; it reads them back
checking everything before anything is built: a missing or unreadable file, a document of
another format, weights that do not fit the module the document describes are each a
:class:`~edgesplit.errors.ConfigError` naming the file and what to do. Each system keeps only
its payload: what goes into the document and which tensors are its state.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from edgesplit.errors import ConfigError
from edgesplit.nas.core.files import read_document, replacing, write_json

__all__ = ["CheckpointFormat"]


@dataclass(frozen=True)
class CheckpointFormat:
    """One kind of checkpoint folder: ``format`` (``name/version``: bump the version when the
    document or the folder changes), the ``document`` and ``weights`` file names, ``what`` it
    holds (for messages), ``make`` (how to make one) and ``resave`` (how to write a matching
    pair again)."""

    format: str
    document: str
    weights: str
    what: str
    make: str
    resave: str

    def save(self, folder: str | Path, doc: Mapping[str, Any],
             state: Mapping[str, torch.Tensor]) -> Path:
        """``state`` and the document ``{"format": ..., **doc}`` written into ``folder``
        (created if needed)."""
        out = Path(folder)
        out.mkdir(parents=True, exist_ok=True)
        with replacing(out / self.weights) as tmp:
            save_file(dict(state), str(tmp), metadata={"format": self.format})
        write_json(out / self.document, {"format": self.format, **doc})
        return out

    def read(self, folder: str | Path) -> dict[str, Any]:
        """The document in ``folder``, of this format."""
        return read_document(folder, self.document, what=self.what, fix=self.make,
                             expected_format=self.format)

    def load_state(self, folder: str | Path, expected: Mapping[str, torch.Tensor], *,
                   fits: str) -> dict[str, torch.Tensor]:
        """The weights in ``folder``, on the CPU, with exactly the names, shapes and dtypes of
        ``expected`` (tensors on the meta device will do); ``fits`` names what they must
        match (the architecture, the space in the document)."""
        path = Path(folder) / self.weights
        if not path.is_file():
            raise ConfigError(f"{str(path)!r} does not exist: the folder holds "
                              f"{self.document} but no weights; {self.resave}")
        try:
            state = load_file(str(path), device="cpu")
        except (SafetensorError, OSError, ValueError) as exc:
            raise ConfigError(f"{str(path)!r} is not a readable safetensors file ({exc}); "
                              f"{self.resave}") from None
        problems = _mismatches(expected, state)
        if problems:
            raise ConfigError(f"{str(path)!r} does not match the {fits} in {self.document}: "
                              f"{'; '.join(problems[:5])}; {self.resave}")
        return state


def _mismatches(expected: Mapping[str, torch.Tensor], state: Mapping[str, torch.Tensor]
                ) -> list[str]:
    problems: list[str] = []
    missing = sorted(expected.keys() - state.keys())
    unexpected = sorted(state.keys() - expected.keys())
    if missing:
        problems.append(f"missing {_few(missing)}")
    if unexpected:
        problems.append(f"unexpected {_few(unexpected)}")
    for key in sorted(expected.keys() & state.keys()):
        want, got = expected[key], state[key]
        if want.shape != got.shape or want.dtype != got.dtype:
            problems.append(f"{key} is {_describe(got)}, expected {_describe(want)}")
    return problems


def _few(keys: list[str]) -> str:
    return ", ".join(keys[:3]) + (f" and {len(keys) - 3} more" if len(keys) > 3 else "")


def _describe(t: torch.Tensor) -> str:
    return f"{str(t.dtype).replace('torch.', '')}{list(t.shape)}"

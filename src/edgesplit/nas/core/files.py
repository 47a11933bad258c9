"""What the three NAS systems read and write alike: a SPACE argument (a registered name or a
file) and versioned JSON documents (result folders, latency tables, checkpoints' manifests).

Every file is written whole or not at all (:func:`replacing`): a reader, or a run that resumes
from a folder a killed run left, never finds half a document.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from edgesplit.errors import ConfigError, EdgesplitError

__all__ = ["read_document", "read_json", "replacing", "resolve_spec", "write_json"]

T = TypeVar("T")


def resolve_spec(spec: str | Path | T, kind: type[T], get: Callable[[str], T]) -> T:
    """``spec`` itself if it is a ``kind``, the ``kind.from_dict`` of a JSON/YAML/TOML file it
    names, or the registered ``get(name)``: the rule every SPACE argument follows."""
    if isinstance(spec, kind):
        return spec
    text = str(spec)
    if isinstance(spec, Path) or "/" in text or text.endswith((".json", ".yaml", ".yml", ".toml")):
        from edgesplit.hardware.files import read_config

        data = read_config(text if not isinstance(spec, Path) else spec)
        return kind.from_dict(data)  # type: ignore[attr-defined]  # both kinds have it
    return get(text)


@contextmanager
def replacing(path: Path) -> Iterator[Path]:
    """A temporary file beside ``path`` to write; it replaces ``path`` in one step when the
    block ends without an error, and is removed when it raises."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_json(path: Path, doc: Any) -> Path:
    """``doc`` written to ``path`` as JSON indented by two, with a final newline: the layout of
    every NAS result file, table and checkpoint manifest. Written whole or not at all."""
    text = json.dumps(doc, indent=2) + "\n"
    with replacing(path) as tmp:
        tmp.write_text(text)
    return path


def read_json(path: str | Path, *, what: str, fix: str,
              error: type[EdgesplitError] = ConfigError) -> Any:
    """The JSON document in ``path``; a file that cannot be read or parsed is an ``error``
    naming ``what`` it should hold, the file and ``fix`` (what to do)."""
    try:
        return json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise error(f"cannot read {what} {str(path)!r}: not readable JSON ({exc}); {fix}"
                    ) from None


def read_document(folder: str | Path, name: str, *, what: str, fix: str,
                  expected_format: str | None = None) -> dict[str, Any]:
    """The JSON object ``name`` in result folder ``folder``, which holds ``what``: a missing
    file, unreadable JSON or (given ``expected_format``) a document of another format is a
    ConfigError that ends with ``fix``."""
    path = Path(folder) / name
    if not path.is_file():
        raise ConfigError(f"{folder} holds no {what}: {name} is missing ({str(path)!r} does "
                          f"not exist); {fix}")
    doc = read_json(path, what=what, fix=fix)
    if not isinstance(doc, dict):
        raise ConfigError(f"{str(path)!r} holds {type(doc).__name__}, not a JSON object; {fix}")
    if expected_format is not None and doc.get("format") != expected_format:
        raise ConfigError(f"{str(path)!r} has format {doc.get('format')!r}, this edgesplit "
                          f"reads {expected_format!r}; {fix}")
    return doc

"""One generic name -> entry registry: register, get with did-you-mean errors, lazy loading.

Models, data sets, planners, devices, links and topologies each kept a dict and repeated the
close-match error; this is the shared mechanism they can move onto. It imports nothing of
edgesplit but ``errors``, so any package may build on it.
"""

from __future__ import annotations

import difflib
import warnings
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar, overload

from edgesplit.errors import UnknownNameError

__all__ = ["Registry"]

T = TypeVar("T")


class Registry(Generic[T]):
    """Named entries of one kind, e.g. ``Registry[ModelSpec]("model", label="Built-in models")``.

    ``loader`` runs once, on the first lookup, so that preset modules which register themselves
    on import are imported only when someone asks for a name. ``hint`` ends the unknown-name
    message with what else the user can do (pass a file, run a listing command).
    """

    def __init__(self, kind: str, *, label: str | None = None, hint: str = "",
                 loader: Callable[[], object] | None = None) -> None:
        self.kind = kind
        self.label = label or f"Known {kind}s"
        self.hint = hint
        self._loader = loader
        self._entries: dict[str, T] = {}

    @overload
    def register(self, name: str, entry: T, *, replace: bool = False) -> T: ...
    @overload
    def register(self, name: str, *, replace: bool = False) -> Callable[[T], T]: ...

    def register(self, name: str, entry: T | None = None, *,
                 replace: bool = False) -> T | Callable[[T], T]:
        """Add ``entry`` under ``name``; without ``entry``, return a decorator that adds its
        target."""
        if entry is None:
            return lambda target: self._add(name, target, replace)
        return self._add(name, entry, replace)

    def _add(self, name: str, entry: T, replace: bool) -> T:
        if name in self._entries and not replace:
            # stacklevel 4: past _add, register (and the decorator) to the caller's line.
            warnings.warn(f"{self.kind} {name!r} registered twice; the later definition wins",
                          stacklevel=4)
        self._entries[name] = entry
        return entry

    def get(self, name: str) -> T:
        """The entry for ``name``; an unknown name lists close matches and every known name."""
        self._load()
        try:
            return self._entries[name]
        except KeyError:
            raise self.unknown(name) from None

    def unknown(self, name: str) -> UnknownNameError:
        """The error for an unknown ``name``, for callers that look up more than one place."""
        self._load()
        close = difflib.get_close_matches(name, self._entries, n=3)
        did_you_mean = f" Did you mean {', '.join(close)}?" if close else ""
        tail = f" {self.hint}" if self.hint else ""
        return UnknownNameError(f"unknown {self.kind} {name!r}.{did_you_mean} "
                                f"{self.label}: {', '.join(self.names())}{tail}")

    def names(self) -> list[str]:
        """Every registered name, sorted."""
        self._load()
        return sorted(self._entries)

    def items(self) -> list[tuple[str, T]]:
        """(name, entry) pairs sorted by name."""
        self._load()
        return sorted(self._entries.items())

    def __contains__(self, name: object) -> bool:
        self._load()
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        self._load()
        return len(self._entries)

    def _load(self) -> None:
        # Cleared before calling: the loader's modules register through this registry, and a
        # lookup made while they import must not run the loader again.
        loader, self._loader = self._loader, None
        if loader is not None:
            loader()

"""The latency table type both NAS systems' tables specialise: seconds, and one file format.

A table prices a network from its parts: a fixed part every network pays (side inputs, a stem
and a head, an overhead) plus one entry per part it is made of (a branch, an op at a layer).
JMSNAS's :class:`~edgesplit.nas.jmsnas.latency.LatencyTable` and AdaptiveNet's
:class:`~edgesplit.nas.adaptivenet.latency.BlockLatencyTable` are this type with their own
entries, their own fit check (the space and device, the supernet) and their own way to be
measured (:mod:`edgesplit.nas.core.timing`).

Every entry is in **seconds**, in memory and in the file; a table that speaks milliseconds to
its callers (JMSNAS's, for budgets in ms) converts at its methods' edge. The file is a JSON
object: ``kind`` (which table), ``version`` (of that kind's layout), ``unit`` (``"seconds"``),
then the kind's own fields. A file of another kind, of a version this edgesplit cannot read,
in another unit or with missing or bad fields is refused with a :class:`TableFormatError`
that says how to build a good one; an older version whose conversion is cheap (JMSNAS's
version 1, in milliseconds) is read by converting it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, ClassVar, NoReturn, Self

from edgesplit.errors import ConfigError
from edgesplit.nas.core.files import read_json, write_json

__all__ = ["UNIT", "SecondsTable", "TableFormatError"]

UNIT = "seconds"


class TableFormatError(ConfigError):
    """A latency table that cannot be used as written: another kind, an unknown version,
    another unit, missing or bad entries. The message ends with how to build a good one."""


class SecondsTable:
    """The part every latency table shares (a mixin for a frozen dataclass).

    A subclass names its file (``KIND``, ``VERSION``, the ``READS`` of older versions), says
    what it is (``WHAT``: "latency table") and how to rebuild one (``REBUILD``), and defines
    its fields (:meth:`payload`, :meth:`from_payload`) and its lookup (:attr:`fixed_seconds`,
    :meth:`entry_seconds`)."""

    KIND: ClassVar[str]
    VERSION: ClassVar[int]
    WHAT: ClassVar[str]
    TITLE: ClassVar[str]  # "an edgesplit latency table": what another kind of file is not
    REBUILD: ClassVar[str]  # what to do to get a good table
    # older versions this edgesplit still reads: version -> its document converted to VERSION
    READS: ClassVar[Mapping[int, Callable[[dict[str, Any]], dict[str, Any]]]] = {}

    # -- lookup ------------------------------------------------------------------------------

    @property
    def fixed_seconds(self) -> float:
        """What every network priced by this table pays."""
        raise NotImplementedError

    def entry_seconds(self, key: Any) -> float:
        """Seconds of one part (a branch name, a (layer, op) position)."""
        raise NotImplementedError

    def total_seconds(self, keys: Iterable[Any]) -> float:
        """A network of these parts: the fixed part plus the sum of their entries."""
        return self.fixed_seconds + sum(self.entry_seconds(key) for key in keys)

    # -- checks ------------------------------------------------------------------------------

    def rebuild(self) -> str:
        """How to rebuild this table (a subclass may name its space and device)."""
        return self.REBUILD

    def refuse(self, problem: str) -> NoReturn:
        """A :class:`TableFormatError`: ``problem`` and how to rebuild the table."""
        raise TableFormatError(f"{self.WHAT} {problem}; {self.rebuild()}")

    def seconds(self, field: str, value: Any, *, least: float | None = 0.0) -> float:
        """``value`` of entry ``field`` as a float: finite, and at least ``least`` (None: any
        sign, as a fitted overhead may have); else refused."""
        if isinstance(value, bool) or not isinstance(value, int | float) \
                or not math.isfinite(value) or (least is not None and value < least):
            bound = f"must be >= {least:g}, a" if least is not None else "must be a"
            self.refuse(f"{field}={value!r} {bound} finite number of {UNIT}")
        return float(value)

    def check_batch(self, batch: Any) -> None:
        if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
            self.refuse(f"batch={batch!r} must be a positive integer")

    # -- files -------------------------------------------------------------------------------

    @property
    def version(self) -> int:
        return self.VERSION

    def payload(self) -> dict[str, Any]:
        """The kind's own fields of the JSON document."""
        raise NotImplementedError

    @classmethod
    def from_payload(cls, data: Mapping[str, Any]) -> Self:
        """The table of a document of this kind and version (a KeyError, TypeError or
        ValueError for a missing or bad field)."""
        raise NotImplementedError

    def to_dict(self) -> dict[str, Any]:
        """The JSON document: ``kind``, ``version``, ``unit``, then the kind's fields."""
        return {"kind": self.KIND, "version": self.VERSION, "unit": UNIT, **self.payload()}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, source: str = "") -> Self:
        """Inverse of :meth:`to_dict` (an older version converted when it is one of
        ``READS``); anything else is a :class:`TableFormatError` that says what to do."""
        what = repr(source) if source else "this document"
        if not isinstance(data, Mapping) or data.get("kind") != cls.KIND:
            raise TableFormatError(f"{what} is not {cls.TITLE}; {cls.REBUILD}")
        version = data.get("version")
        if version != cls.VERSION:
            convert = cls.READS.get(version) if isinstance(version, int) else None
            if convert is None:
                older = "".join(f" (and converts version {v})" for v in sorted(cls.READS))
                raise TableFormatError(f"{cls.WHAT} {what} has version {version!r}; this "
                                       f"edgesplit reads version {cls.VERSION}{older}: "
                                       f"{cls.REBUILD}")
            data = convert(dict(data))
        try:
            if data.get("unit", UNIT) != UNIT:
                raise ConfigError(f"unit {data['unit']!r} is not {UNIT!r}")
            return cls.from_payload(data)
        except TableFormatError as exc:  # says what to do already
            raise TableFormatError(f"{cls.WHAT} {what} is malformed: {exc}") from None
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            detail = str(exc) if isinstance(exc, ConfigError) \
                else f"{type(exc).__name__}: {exc}"
            raise TableFormatError(f"{cls.WHAT} {what} is malformed ({detail}); "
                                   f"{cls.REBUILD}") from None

    def save(self, path: str | Path) -> Path:
        """Write the table as JSON (a file a user can ship with a searched model)."""
        return write_json(Path(path), self.to_dict())

    @classmethod
    def read(cls, path: str | Path) -> Self:
        """The table in the file ``path`` (not yet checked against what it is for)."""
        data = read_json(path, what=cls.WHAT, fix=cls.REBUILD, error=TableFormatError)
        return cls.from_dict(data, source=str(path))

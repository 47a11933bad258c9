"""edgesplit: split PyTorch models across devices.

The package itself stays light (``import edgesplit`` imports no torch); its sub-packages hold
the library. ``edgesplit.split_point`` is :func:`edgesplit.graph.split_point`, imported on first
use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from edgesplit.graph.markers import split_point

__all__ = ["split_point"]


def __getattr__(name: str) -> Any:
    if name == "split_point":
        from edgesplit.graph.markers import split_point

        globals()["split_point"] = split_point
        return split_point
    raise AttributeError(f"module 'edgesplit' has no attribute {name!r}")

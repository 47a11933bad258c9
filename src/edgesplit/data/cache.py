"""Where edgesplit keeps what it generates or trains on first use (weights, rendered data).

``$EDGESPLIT_CACHE_DIR``, default ``~/.cache/edgesplit``. It lives in ``data`` (layer 1) so
that data sets can cache without importing ``models``, which re-exports it.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["cache_dir"]


def cache_dir() -> Path:
    """The cache folder (not created here: writers create it and cope when they cannot)."""
    return Path(os.environ.get("EDGESPLIT_CACHE_DIR") or Path.home() / ".cache" / "edgesplit")

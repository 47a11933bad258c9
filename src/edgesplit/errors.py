"""The one exception hierarchy of edgesplit.

A user mistake (bad model path, unknown device, infeasible constraints, malformed payload) raises
an :class:`EdgesplitError` subclass whose message says what to do; the CLI prints it as one line
and exits non-zero. Any other exception is a bug and keeps its traceback.
"""

from __future__ import annotations

__all__ = [
    "EdgesplitError",
    "ConfigError",
    "UnknownNameError",
    "CaptureError",
    "GraphError",
    "InfeasibleError",
    "WireError",
    "RemoteError",
]


class EdgesplitError(Exception):
    """Base class of every error caused by input the user can fix."""


class ConfigError(EdgesplitError, ValueError):
    """A configuration value or file is invalid (names the field, the value and what is allowed)."""


class UnknownNameError(ConfigError, KeyError):
    """A registry lookup (model, device, link, planner...) named something that does not exist."""

    def __str__(self) -> str:  # KeyError would otherwise quote the message
        return str(self.args[0]) if self.args else ""


class CaptureError(EdgesplitError):
    """A model could not be captured: unreadable file, wrong input shape, export failure."""


class GraphError(EdgesplitError, ValueError):
    """A query on a LayerGraph is malformed (unknown layer, edge set that is not a down-set)."""


class InfeasibleError(EdgesplitError):
    """No plan satisfies the constraints; the message names the constraint."""


class WireError(EdgesplitError):
    """Bytes on the wire are malformed, truncated or of an unknown version."""


class RemoteError(EdgesplitError):
    """A remote peer failed or could not be reached."""

"""The one exception hierarchy of edgesplit.

A user mistake (bad model path, unknown device, infeasible constraints, malformed payload) raises
an :class:`EdgesplitError` subclass whose message says what to do; the CLI prints it as one line
and exits non-zero. Any other exception is a bug and keeps its traceback.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

__all__ = [
    "CaptureError",
    "ConfigError",
    "ContextLimitError",
    "EdgesplitError",
    "GraphError",
    "InfeasibleError",
    "RemoteError",
    "SessionError",
    "SessionOwnerError",
    "SessionsBusyError",
    "UnknownNameError",
    "WireError",
    "cli_options",
    "option",
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


class SessionError(EdgesplitError):
    """An LLM generation session cannot take this step (unknown or evicted session, a step
    out of order); the message says to start it again."""


class ContextLimitError(SessionError):
    """An LLM session would hold more tokens than the plan's max context."""


class SessionOwnerError(SessionError):
    """An LLM session belongs to another client (its secret differs): use an id of your own."""


class SessionsBusyError(SessionError):
    """Every KV cache a stage may hold is in a step: none can make room for another session
    before the request's deadline; try again."""


# How an error message names the setting that fixes it: Python users see the keyword argument
# (``trust_model_file=True``), CLI users the flag (``--trust-model-file``). The CLI switches the
# style for the duration of a command; the library never spells a flag itself.
_CLI_STYLE: ContextVar[bool] = ContextVar("edgesplit_cli_style", default=False)


def option(name: str, value: Any = None, *, flag: str | None = None) -> str:
    """The setting ``name`` (a keyword argument) as the current caller would write it.

    ``option("trust_model_file", True)`` is ``trust_model_file=True`` in Python and
    ``--trust-model-file`` under the CLI; ``option("max_bytes", "2MiB")`` becomes
    ``max_bytes='2MiB'`` or ``--max-bytes 2MiB``. ``flag`` names the CLI flag where it is not
    the keyword with hyphens."""
    if _CLI_STYLE.get():
        cli = flag or "--" + name.replace("_", "-")
        return cli if value is None or value is True else f"{cli} {value}"
    return name if value is None else f"{name}={value!r}"


@contextmanager
def cli_options() -> Iterator[None]:
    """Render :func:`option` as CLI flags inside this block (the CLI wraps each command)."""
    token = _CLI_STYLE.set(True)
    try:
        yield
    finally:
        _CLI_STYLE.reset(token)

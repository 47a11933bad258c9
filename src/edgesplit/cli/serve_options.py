"""The flags every serve command shares, written once: ``@serve_options`` adds them to a command
and hands it one :class:`~edgesplit.runtime.options.ServeOptions` built from them.

``SERVE_FLAGS`` is the one place a shared server setting becomes flags: each entry names the
``ServeOptions`` field it makes, its flags (typer parameters the decorator appends to the
command's own), and how their values make the field (None: the one flag's value as it is).
``edgesplit serve`` and ``edgesplit llm serve`` both take every entry; adding a setting to
both is one entry here (and its field on ``ServeOptions``). ``edgesplit serve-training`` takes
the flags that mean the same for it (``only=``: its token and TLS certificate; it calls no
next device and has no data plane), the others left at their defaults.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Collection
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, TypeVar

import typer

from edgesplit.cli._app import (
    SHAPE_HELP,
    TLS_SERVER_NAME_HELP,
    TOKEN_FILE_HELP,
    TOKEN_HELP,
    connection_limits,
    tls_files,
)

__all__ = ["SERVE_FLAGS", "Flag", "serve_options"]

F = TypeVar("F", bound=Callable[..., Any])
_LIMITS = "Connection limits"


@dataclass(frozen=True)
class Flag:
    """One command-line flag: the command's parameter ``name``, its declaration (``--x`` or
    ``--x/--no-x``), type, default and help (``{work}``: what the server serves, as the
    command says it), in help panel ``panel`` (None: the options)."""

    name: str
    decl: str
    type: Any
    default: Any
    help: str
    panel: str | None = None

    def parameter(self, defaults: dict[str, Any], work: str) -> inspect.Parameter:
        option = typer.Option(defaults.get(self.name, self.default), self.decl,
                              help=self.help.format(work=work), rich_help_panel=self.panel)
        return inspect.Parameter(self.name, inspect.Parameter.KEYWORD_ONLY, default=option,
                                 annotation=self.type)


def _token(token: str | None, token_file: Path | None) -> str | None:
    from edgesplit.transport import read_token

    return read_token(token, token_file)


def _data_port(data_port: str) -> int | None:
    from edgesplit.cli.serving import _data_port as parse

    return parse(data_port)


def _data_plane(data_plane: str) -> str:
    from edgesplit.cli.serving import _data_plane as parse

    return parse(data_plane)


SERVE_FLAGS: tuple[tuple[str, tuple[Flag, ...], Callable[..., Any] | None], ...] = (
    ("token", (Flag("token", "--token", str | None, None, TOKEN_HELP),
               Flag("token_file", "--token-file", Path | None, None, TOKEN_FILE_HELP)),
     _token),
    ("tls", (Flag("tls_cert", "--tls-cert", Path | None, None, "Serve TLS: certificate."),
             Flag("tls_key", "--tls-key", Path | None, None, "Serve TLS: private key."),
             Flag("tls_ca", "--tls-ca", Path | None, None,
                  "Reach --next over TLS, trusting this CA."),
             Flag("tls_server_name", "--tls-server-name", str | None, None,
                  TLS_SERVER_NAME_HELP)),
     tls_files),
    ("shape", (Flag("shape", "--shape/--no-shape", bool, False, SHAPE_HELP),), None),
    ("max_workers", (Flag("workers", "--workers", int, 32, "Concurrent {work} served."),),
     None),
    ("data_port", (Flag("data_port", "--data-port", str, "0", "Port of the data plane (TCP "
                        "frames beside gRPC; 0: any free port; off: none)."),), _data_port),
    ("data_plane", (Flag("data_plane", "--data-plane", str, "auto", "How to call --next: "
                         "auto (its data plane if it has one), grpc or tcp."),), _data_plane),
    ("limits", (
        Flag("idle_timeout_s", "--idle-timeout-s", float | None, None,
             "Close a connection (data plane or gRPC stream) silent this long between calls "
             "(default 300).", _LIMITS),
        Flag("frame_timeout_s", "--frame-timeout-s", float | None, None,
             "A call's header and meta must arrive within this once it started (default 60).",
             _LIMITS),
        Flag("hello_timeout_s", "--hello-timeout-s", float | None, None,
             "A new connection must send its first call, with the token, within this "
             "(default 10).", _LIMITS),
        Flag("pending_bytes", "--pending-bytes", str | None, None,
             "Memory all calls still arriving may hold together, e.g. 512MiB (default: four "
             "message limits, at least 256MiB); a call that would need more is refused.",
             _LIMITS)),
     connection_limits),
)


def serve_options(*, work: str, only: Collection[str] | None = None,
                  **defaults: Any) -> Callable[[F], F]:
    """Give a command every flag of :data:`SERVE_FLAGS` (after its own; ``only``: just the
    flags of these parameter names, a field none of whose flags it takes left at its
    ``ServeOptions`` default; ``defaults`` by parameter name where the command's differ;
    ``work``: what it serves, for the help) and call it with them as ``options``, a
    ``ServeOptions``. The flags are read in the table's order, before the command runs: a
    bad one is refused naming itself."""
    def taken(flag: Flag) -> bool:
        return only is None or flag.name in only

    names = {flag.name for _, flags, _ in SERVE_FLAGS for flag in flags}
    if only is not None and not set(only) <= names:  # a typo fails on import
        raise AssertionError(f"serve_options(only=...) names no flag {sorted(set(only) - names)}")

    def decorate(command: F) -> F:
        signature = inspect.signature(command)
        own = [p for p in signature.parameters.values() if p.name != "options"]
        added = [flag.parameter(defaults, work) for _, flags, _ in SERVE_FLAGS
                 for flag in flags if taken(flag)]

        @functools.wraps(command)
        def run(*args: Any, **kwargs: Any) -> Any:
            from edgesplit.runtime.options import ServeOptions

            made = {}
            for field, flags, read in SERVE_FLAGS:
                if not any(taken(flag) for flag in flags):
                    continue
                values = [kwargs.pop(flag.name) if taken(flag) else
                          defaults.get(flag.name, flag.default) for flag in flags]
                made[field] = read(*values) if read is not None else values[0]
            return command(*args, **kwargs, options=ServeOptions(**made))

        run.__signature__ = signature.replace(parameters=[*own, *added])  # type: ignore[attr-defined]
        # typer reads the annotations too: the command's own (strings, read in its module)
        # and the flags' (types)
        run.__annotations__ = {**{k: v for k, v in command.__annotations__.items()
                                  if k != "options"},
                               **{p.name: p.annotation for p in added}}
        return run  # type: ignore[return-value]

    return decorate


def _check_table() -> None:
    """Every SERVE_FLAGS entry names a ServeOptions field (a typo fails on import, not when a
    user passes the flag)."""
    from edgesplit.runtime.options import ServeOptions

    known = {f.name for f in fields(ServeOptions)}
    unknown = [field for field, _, _ in SERVE_FLAGS if field not in known]
    if unknown:
        raise AssertionError(f"SERVE_FLAGS names no ServeOptions field {unknown}")


_check_table()

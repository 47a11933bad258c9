"""What every command module shares: the typer app, the consoles, one-line user errors, JSON
output, and the options several commands take (model-file trust, TLS, tokens, backends)."""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.console import Console

from edgesplit.errors import EdgesplitError, cli_options

if TYPE_CHECKING:
    from edgesplit.transport.limits import ConnectionLimits

__all__ = [
    "BACKEND_HELP",
    "TOKEN_FILE_HELP",
    "TOKEN_HELP",
    "TRUST_HELP",
    "app",
    "emit_json",
    "err",
    "load_program",
    "model_ref",
    "out",
    "tls_files",
    "user_errors",
]

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Where to cut a PyTorch model across devices and links, and how to run it.")
# Piped output is not a terminal and rich would wrap at 80 columns; tables need more room.
out = Console() if Console().is_terminal else Console(width=200)
err = Console(stderr=True)


@app.callback()
def _setup(verbose: bool = typer.Option(False, "--verbose", "-v", help="Log progress details.")
           ) -> None:
    """The one logging setup: library modules log, only the CLI configures handlers."""
    if verbose:
        import logging

        from rich.logging import RichHandler

        logging.basicConfig(level=logging.DEBUG, format="%(name)s: %(message)s",
                            handlers=[RichHandler(console=err, show_path=False)])
        for noisy in ("torch", "transformers", "filelock"):
            logging.getLogger(noisy).setLevel(logging.WARNING)


def user_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            with cli_options():  # library messages name flags, not keyword arguments
                return fn(*args, **kwargs)
        except EdgesplitError as exc:
            from rich.markup import escape

            # escaped: a message's own brackets (pip install 'edgesplit[ray]') are not markup
            err.print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False,
                      soft_wrap=True)
            raise typer.Exit(2) from None

    return wrapper


def emit_json(doc: Any, path: Path | None = None) -> None:
    text = json.dumps(doc, indent=2)
    if path is not None:
        path.write_text(text + "\n")
    else:
        sys.stdout.write(text + "\n")


TRUST_HELP = ("Load a .pt2 model file even if it holds pickled data, which runs code when "
              "loaded: only for files whose author you trust.")


def model_ref(model: str, trust_model_file: bool) -> str:
    """MODEL as given, marked trusted with --trust-model-file: the library captures it again
    in several places and each inherits the decision."""
    from edgesplit.graph import TrustedModelFile

    return TrustedModelFile(model) if trust_model_file else model


TLS_SERVER_NAME_HELP = ("Check the server's certificate against this name instead of the "
                        "host dialled (e.g. a server reached by IP whose certificate names "
                        "its host); needs --tls-ca.")


def tls_files(cert: Path | None, key: Path | None, ca: Path | None,
              server_name: str | None = None):
    """The TLS files given on the command line, read, and the name a client checks the
    server's certificate against; None when none was given."""
    if cert is None and key is None and ca is None and server_name is None:
        return None
    from edgesplit.errors import ConfigError
    from edgesplit.transport.tls import TlsFiles

    def read(path: Path | None) -> bytes | None:
        if path is None:
            return None
        if not path.is_file():
            raise ConfigError(f"TLS file {str(path)!r} does not exist")
        return path.read_bytes()

    return TlsFiles(cert=read(cert), key=read(key), ca=read(ca), server_name=server_name)


def set_threads(threads: int | None) -> None:
    """Set torch's thread count for this command (None: torch's default, one per core). A
    busy machine's cores are better left to one thread than fought over by two, and several
    servers on one machine each want their share, not all of it."""
    if threads is not None:
        import torch

        torch.set_num_threads(threads)


THREADS_HELP = ("Torch threads for compute (default: one per core; give each of several "
                "processes on one machine its share).")
LLM_THREADS_HELP = ("Compute threads: torch's for a float plan (default: one per core), "
                    "ONNX Runtime's for quantized weights (default 1); give each of several "
                    "processes on one machine its share.")


def load_program(plan_path: Path, backend: str = "torch", trust_model_file: bool = False,
                 torch_device: str | None = None):
    """The plan file made executable, with a spinner while the model is captured again."""
    from edgesplit.plan import load_plan
    from edgesplit.runtime import PlanProgram

    with err.status(f"loading {plan_path} ...", spinner="dots"):
        return PlanProgram.load(load_plan(plan_path), backend=backend,
                                trust_model_file=trust_model_file, torch_device=torch_device)


def check_torch_device(spec: str | None):
    """--torch-device as a torch device this machine has; checked first, so that a missing
    accelerator is one line before any plan or model is read."""
    from edgesplit.hardware.accelerator import torch_device as resolve

    return resolve(spec)


TORCH_DEVICE_HELP = ("Where this process computes: cpu (default), cuda, cuda:N or mps "
                     "(tensors on the wire stay in host memory).")


BACKEND_HELP = ("torch (the captured program), torchscript (the same, a part called again "
                "with the same shapes run as a checked TorchScript trace) or onnxruntime (each "
                "part exported to ONNX).")
TOKEN_HELP = ("Bearer token (both sides give the same). Visible in `ps`: prefer --token-file "
              "or the EDGESPLIT_TOKEN environment variable.")
TOKEN_FILE_HELP = "Read the bearer token from this file (one line)."
def require_positive(**flags: float | None) -> None:
    """Refuse, before any work, a flag that must be positive (``latency_budget_ms=0`` names
    ``--latency-budget-ms``); None (not given) passes."""
    from edgesplit.errors import ConfigError

    for name, value in flags.items():
        if value is not None and not value > 0:
            raise ConfigError(f"--{name.replace('_', '-')} must be positive, got {value:g}")


def connection_limits(idle_timeout_s: float | None, frame_timeout_s: float | None,
                      hello_timeout_s: float | None, pending_bytes: str | None
                      ) -> ConnectionLimits | None:
    """The four connection-limit flags as the server's limits; None when none is given (the
    server keeps its defaults). A bad value is refused naming its flag."""
    from edgesplit.transport.limits import ConnectionLimits
    from edgesplit.units import parse_bytes

    require_positive(idle_timeout_s=idle_timeout_s, frame_timeout_s=frame_timeout_s,
                     hello_timeout_s=hello_timeout_s)
    budget = parse_bytes(pending_bytes, "--pending-bytes")
    if budget is not None and budget <= 0:
        from edgesplit.errors import ConfigError

        raise ConfigError(f"--pending-bytes must be positive, got {pending_bytes}")
    flags: dict[str, Any] = {"idle_s": idle_timeout_s, "frame_s": frame_timeout_s,
                             "hello_s": hello_timeout_s, "pending_bytes": budget}
    given = {name: value for name, value in flags.items() if value is not None}
    return ConnectionLimits(**given) if given else None  # a flag left out keeps its default


def rehearsal(shape: bool, emulate: bool) -> str:
    """What of a plan a command rehearses rather than runs for real, as its start-up line and
    report say it: ``links=shaped|real compute=emulated|real``."""
    return (f"links={'shaped' if shape else 'real'} "
            f"compute={'emulated' if emulate else 'real'}")


SHAPE_HELP = ("Rehearse the plan's links: each send waits its link's bandwidth and RTT "
              "(default off: over a real network, the network's own time is what counts).")

"""The ``edgesplit`` command line: a thin layer over the library, one module per command group.

Every command builds the same objects a Python user would, calls the library, and renders a rich
table (built in ``edgesplit.report``) or, with ``--json``, one JSON document on stdout. User
mistakes (EdgesplitError) print one line on stderr and exit with status 2; anything else is a bug
and keeps its traceback.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import os
import sys
import threading

# importing a command module registers its commands; --help lists them in this order
# isort: off
from edgesplit.cli import inspect  # noqa: F401
from edgesplit.cli import hardware  # noqa: F401
from edgesplit.cli import plan  # noqa: F401
from edgesplit.cli import serving  # noqa: F401
from edgesplit.cli import training  # noqa: F401
from edgesplit.cli import finetune  # noqa: F401
from edgesplit.cli import nas  # noqa: F401
from edgesplit.cli import splitnets  # noqa: F401
from edgesplit.cli import adaptivenet  # noqa: F401
from edgesplit.cli import llm  # noqa: F401
from edgesplit.cli import llm_api  # noqa: F401
# isort: on
from edgesplit.cli._app import app

__all__ = ["app", "main"]


def main() -> None:
    """The ``edgesplit`` script. Commands import torch when they run, not before (--help is
    instant); the two start-up settings below are the script's, not the library's."""
    # Importing torch and torch.export creates millions of objects, almost none garbage; at the
    # default gen-0 threshold (700) the collector runs thousands of times over them, 0.3 s of a
    # 2 s start. A larger threshold collects the same cycles later (mypy does the same).
    gc.set_threshold(10_000, 10, 10)
    try:
        app()
    except SystemExit as exc:
        _exit_fast(exc)
    raise AssertionError("typer's app() always ends in SystemExit")  # pragma: no cover


def _exit_fast(exc: SystemExit) -> None:
    """End the process without the interpreter's teardown, once the command is done.

    Tearing down a process that imported torch.export takes ~0.5 s (every module and object
    freed one by one), longer than many commands run. What a normal exit does for the user is
    kept: garbage is collected (closing any file left unreferenced in a cycle), the atexit
    handlers run (logging flushes, multiprocessing joins its children, temporary folders go)
    and stdout/stderr are flushed. Where a thread other than a daemon is still running, or the
    exit carries a message, the normal exit runs instead (it joins those threads, prints it).
    """
    code = exc.code
    alive = [t for t in threading.enumerate()
             if t is not threading.main_thread() and not t.daemon]
    if alive or not (code is None or isinstance(code, int)):
        raise exc
    gc.collect()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a closed pipe: nothing to print to
            stream.flush()
    os._exit(code or 0)

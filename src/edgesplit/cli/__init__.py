"""The ``edgesplit`` command line: a thin layer over the library, one module per command group.

Every command builds the same objects a Python user would, calls the library, and renders a rich
table (built in ``edgesplit.report``) or, with ``--json``, one JSON document on stdout. User
mistakes (EdgesplitError) print one line on stderr and exit with status 2; anything else is a bug
and keeps its traceback.
"""

from __future__ import annotations

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
    app()

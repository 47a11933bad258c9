"""``python -m edgesplit.cli``."""

from edgesplit.cli import main

main()

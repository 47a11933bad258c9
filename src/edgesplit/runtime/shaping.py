"""Link emulation; it lives in :mod:`edgesplit.transport.shaping` (inference and training
both shape their links) and is re-exported here."""

from edgesplit.transport.shaping import LinkShaper, tc_commands

__all__ = ["LinkShaper", "tc_commands"]

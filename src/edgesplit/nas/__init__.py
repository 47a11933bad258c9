"""Neural architecture search: the core the three systems share, and the systems.

The shared core is :mod:`edgesplit.nas.core` (the evolutionary loop, sampling, the in-context
timer, the latency table type, checkpoints, evaluation, the candidate ops, the versioned files,
the settings' checks; see its docstring). The systems, each a package over that core:
:mod:`~edgesplit.nas.jmsnas` (joint multi-split NAS), :mod:`~edgesplit.nas.splitnets`
(split-aware supernets) and :mod:`~edgesplit.nas.adaptivenet` (post-deployment subnets of a
captured model). The timing primitives below the in-context timer (warm-up, repeats, median)
live a layer down, in :mod:`edgesplit.hardware.timing`.

Experimental: the API may change while the three NAS systems are built on it.
"""

from edgesplit.nas.core.evolution import (
    Breeder,
    Candidate,
    Constraint,
    Evaluation,
    Evaluator,
    EvolutionSearch,
    Progress,
    pareto_front,
)
from edgesplit.nas.core.ops import (
    JMSNAS_CANDIDATES,
    MBConv,
    OpSpec,
    build_op,
    keeps_shape,
    legal_ops,
)

__all__ = [
    "JMSNAS_CANDIDATES",
    "Breeder",
    "Candidate",
    "Constraint",
    "Evaluation",
    "Evaluator",
    "EvolutionSearch",
    "MBConv",
    "OpSpec",
    "Progress",
    "build_op",
    "keeps_shape",
    "legal_ops",
    "pareto_front",
]

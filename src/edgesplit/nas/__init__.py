"""Neural architecture search: the core the three systems share, and the systems.

The shared core (this package's root):

- :mod:`~edgesplit.nas.evolution`: the evolutionary loop (any breeder, constraints with a
  violation, Pareto fronts): the toolkit's :class:`EvolutionSearch`, and the generation steps
  AdaptiveNet's searches run with their own survivors and a whole generation evaluated at once;
- :mod:`~edgesplit.nas.ops`: the MBConv block and the candidate ops' JSON-able specs;
- :mod:`~edgesplit.nas.files`: a SPACE argument (a name or a file) and the versioned JSON
  files every result folder and table is written as;
- :mod:`~edgesplit.nas.checks`: how every trainer and search refuses a setting (rules checked
  before any work, one message style).

The systems, each a package over that core: :mod:`~edgesplit.nas.jmsnas` (joint multi-split
NAS), :mod:`~edgesplit.nas.splitnets` (split-aware supernets) and
:mod:`~edgesplit.nas.adaptivenet` (post-deployment subnets of a captured model). Timing
(warm-up, repeats, median) lives a layer down, in :mod:`edgesplit.hardware.timing`.

Experimental: the API may change while the three NAS systems are built on it.
"""

from edgesplit.nas.evolution import (
    Breeder,
    Candidate,
    Constraint,
    Evaluation,
    Evaluator,
    EvolutionSearch,
    Progress,
    pareto_front,
)
from edgesplit.nas.ops import JMSNAS_CANDIDATES, MBConv, OpSpec, build_op, keeps_shape, legal_ops

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

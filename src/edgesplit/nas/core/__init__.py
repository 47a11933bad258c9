"""The core the three NAS systems share; it imports none of them.

- :mod:`~edgesplit.nas.core.evolution`: the evolutionary loop (any breeder, constraints with a
  violation, Pareto fronts): the toolkit's :class:`EvolutionSearch`, and the generation steps
  AdaptiveNet's searches run with their own survivors and a whole generation evaluated at once;
- :mod:`~edgesplit.nas.core.ops`: the MBConv block and the candidate ops' JSON-able specs;
- :mod:`~edgesplit.nas.core.files`: a SPACE argument (a name or a file) and the versioned JSON
  files every result folder and table is written as;
- :mod:`~edgesplit.nas.core.checks`: how every trainer and search refuses a setting (rules
  checked before any work, one message style).
"""

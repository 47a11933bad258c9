"""The core the three NAS systems share; it imports none of them, and none of them imports
another (``tests/docs/test_architecture.py``).

- :mod:`~edgesplit.nas.core.evolution`: the evolutionary loop (any breeder, constraints with a
  violation, Pareto fronts): the toolkit's :class:`EvolutionSearch`, and the generation steps
  AdaptiveNet's searches run with their own survivors and a whole generation evaluated at once;
- :mod:`~edgesplit.nas.core.sampling`: distinct architectures in a bounded number of draws;
- :mod:`~edgesplit.nas.core.timing`: the in-context timer both latency tables are measured with;
- :mod:`~edgesplit.nas.core.table`: :class:`SecondsTable`, the latency table type both
  systems' tables specialise (seconds, one file format, one lookup);
- :mod:`~edgesplit.nas.core.checkpoint`: a network or supernet in a folder (a versioned JSON
  document and safetensors weights);
- :mod:`~edgesplit.nas.core.evaluate`: top-1 accuracy and batch-norm recalibration;
- :mod:`~edgesplit.nas.core.ops`: the MBConv block and the candidate ops' JSON-able specs;
- :mod:`~edgesplit.nas.core.files`: a SPACE argument (a name or a file) and the versioned JSON
  files every result folder and table is written as, each written whole;
- :mod:`~edgesplit.nas.core.checks`: how every trainer and search refuses a setting (rules
  checked before any work, one message style).
"""

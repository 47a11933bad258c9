"""Shared neural-architecture-search toolkit (JMSNAS, SplitNets, AdaptiveNet build on it).

- :mod:`~edgesplit.nas.ops`: the candidate ops (MBConv, identity) and their JSON-able specs;
- :mod:`~edgesplit.nas.space`: a search space as data, and an architecture in it;
- :mod:`~edgesplit.nas.catalog`: the registry of named spaces (``digits-mbconv``...);
- :mod:`~edgesplit.nas.supernet`: the weight-sharing supernet and its mixed ops;
- :mod:`~edgesplit.nas.network`: the plain network of one architecture (what gets captured);
- :mod:`~edgesplit.nas.sampler`, :mod:`~edgesplit.nas.evolution`: random, mutated and crossed
  architectures, and an evolutionary search with the scikit-learn contract;
- :mod:`~edgesplit.nas.checkpoint`: a network to and from ``arch.json`` + safetensors;
- :mod:`~edgesplit.nas.latency`: per-op latency tables of a space on a device (measured on
  this machine, estimated for presets), their files and their error on whole networks.

Experimental: the API may change while the three NAS systems are built on it.
"""

from edgesplit.nas.catalog import get_space, list_spaces, register_space, resolve_space
from edgesplit.nas.checkpoint import load_network, read_arch, save_network
from edgesplit.nas.evolution import (
    Candidate,
    Constraint,
    Evaluation,
    Evaluator,
    EvolutionSearch,
    Progress,
)
from edgesplit.nas.latency import (
    LATENCY_TABLE_VERSION,
    THIS_MACHINE,
    LatencyTable,
    build_latency_table,
    device_fingerprint,
    machine_identity,
    space_fingerprint,
    validate_latency_table,
)
from edgesplit.nas.network import ArchNet
from edgesplit.nas.ops import JMSNAS_CANDIDATES, MBConv, OpSpec, build_op, keeps_shape, legal_ops
from edgesplit.nas.sampler import crossover, mutate, random_arch
from edgesplit.nas.space import (
    Arch,
    FixedArch,
    HeadSpec,
    LayerSpec,
    SearchSpace,
    StemSpec,
    fixed_arch,
)
from edgesplit.nas.supernet import MixedOp, Supernet

__all__ = [
    "JMSNAS_CANDIDATES",
    "LATENCY_TABLE_VERSION",
    "THIS_MACHINE",
    "Arch",
    "ArchNet",
    "Candidate",
    "Constraint",
    "Evaluation",
    "Evaluator",
    "EvolutionSearch",
    "FixedArch",
    "HeadSpec",
    "LatencyTable",
    "LayerSpec",
    "MBConv",
    "MixedOp",
    "OpSpec",
    "Progress",
    "SearchSpace",
    "StemSpec",
    "Supernet",
    "build_latency_table",
    "build_op",
    "crossover",
    "device_fingerprint",
    "fixed_arch",
    "get_space",
    "keeps_shape",
    "legal_ops",
    "list_spaces",
    "load_network",
    "machine_identity",
    "mutate",
    "random_arch",
    "read_arch",
    "register_space",
    "resolve_space",
    "save_network",
    "space_fingerprint",
    "validate_latency_table",
]

"""JMSNAS (Joint Multi-Split NAS): its search space, supernet, latency models, the two-stage
search and its result folder.

- :mod:`~edgesplit.nas.jmsnas.space`: a search space as data, and an architecture in it;
- :mod:`~edgesplit.nas.jmsnas.catalog`: the registry of named spaces (``digits-mbconv``...);
- :mod:`~edgesplit.nas.jmsnas.supernet`: the weight-sharing supernet and its mixed ops;
- :mod:`~edgesplit.nas.jmsnas.network`: the plain network of one architecture (what gets captured);
- :mod:`~edgesplit.nas.jmsnas.sampler`: random, mutated and crossed architectures (what
  :class:`~edgesplit.nas.core.evolution.EvolutionSearch` breeds a SearchSpace with);
- :mod:`~edgesplit.nas.jmsnas.checkpoint`: a network to and from ``arch.json`` + safetensors;
- :mod:`~edgesplit.nas.jmsnas.latency`: per-op latency tables of a space on a device (measured on
  this machine, estimated for presets), their files and their error on whole networks;
- :mod:`~edgesplit.nas.jmsnas.chain_latency`, :mod:`~edgesplit.nas.jmsnas.mesh_latency`: E[T]
  over a chain (eq. 1) or a mesh (eq. 2); :mod:`~edgesplit.nas.jmsnas.search`: the two stages;
  :mod:`~edgesplit.nas.jmsnas.result`: the result folder; :mod:`~edgesplit.nas.jmsnas.run`:
  all of it as the CLI and the benchmark run it.

Experimental: the API may change while the three NAS systems are built on it.
"""

from edgesplit.nas.jmsnas.catalog import get_space, list_spaces, register_space, resolve_space
from edgesplit.nas.jmsnas.checkpoint import load_network, read_arch, save_network
from edgesplit.nas.jmsnas.latency import (
    LATENCY_TABLE_VERSION,
    THIS_MACHINE,
    LatencyTable,
    build_latency_table,
    device_fingerprint,
    space_fingerprint,
    validate_latency_table,
)
from edgesplit.nas.jmsnas.network import ArchNet
from edgesplit.nas.jmsnas.sampler import SpaceBreeder, crossover, mutate, random_arch
from edgesplit.nas.jmsnas.space import (
    Arch,
    FixedArch,
    HeadSpec,
    LayerSpec,
    SearchSpace,
    StemSpec,
    fixed_arch,
)
from edgesplit.nas.jmsnas.supernet import MixedOp, Supernet

__all__ = [
    "LATENCY_TABLE_VERSION",
    "THIS_MACHINE",
    "Arch",
    "ArchNet",
    "FixedArch",
    "HeadSpec",
    "LatencyTable",
    "LayerSpec",
    "MixedOp",
    "SearchSpace",
    "SpaceBreeder",
    "StemSpec",
    "Supernet",
    "build_latency_table",
    "crossover",
    "device_fingerprint",
    "fixed_arch",
    "get_space",
    "list_spaces",
    "load_network",
    "mutate",
    "random_arch",
    "read_arch",
    "register_space",
    "resolve_space",
    "save_network",
    "space_fingerprint",
    "validate_latency_table",
]

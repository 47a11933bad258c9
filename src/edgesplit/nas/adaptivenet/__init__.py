"""AdaptiveNet (paper 003): elastify a pretrained model into a supernet, search it on the
device with a block latency table and a prefix cache, and switch subnets at run time.

- :mod:`.blocks`: basic blocks of any captured model (single main tensor in and out);
- :mod:`.branch`, :mod:`.prune`: a block as a module owning its weights; structured pruning on
  its FX graph (the shrunk blocks);
- :mod:`.space`, :mod:`.supernet`, :mod:`.elastify`: branches and subnets (paths), the
  supernet, and elastification (merged and shrunk branches);
- :mod:`.data`, :mod:`.train`, :mod:`.checkpoint`: train / search / test data, branch-wise
  distillation then tuning, a supernet in a folder;
- :mod:`.latency`: the block latency table profiled on the device;
- :mod:`.breed`, :mod:`.evaluate`, :mod:`.search`: NearbyInit / NearbyMutate, the
  prefix-tree evaluator, the search and its baselines (plain evolution, simulated annealing);
- :mod:`.pool`, :mod:`.monitor`, :mod:`.runner`, :mod:`.loads`: the subnet pool, the latency
  monitor, the switching runner, injected loads and clocks;
- :mod:`.placement`: beyond the paper, a subnet's latency as its best edge-cloud plan;
- :mod:`.run`: the stages as the CLI and the benchmark run them.

Experimental: the API may change.
"""

from edgesplit.nas.adaptivenet.blocks import Block, BlockSplit, find_blocks
from edgesplit.nas.adaptivenet.breed import NearbyBreeder, UniformBreeder
from edgesplit.nas.adaptivenet.checkpoint import build_supernet, load_supernet, save_supernet
from edgesplit.nas.adaptivenet.data import ElasticData, cosine, load_elastic_data, top1
from edgesplit.nas.adaptivenet.elastify import ElasticConfig, elastify
from edgesplit.nas.adaptivenet.evaluate import (
    EvalStats,
    PrefixTree,
    PrefixTreeEvaluator,
    measure_reuse,
)
from edgesplit.nas.adaptivenet.latency import (
    BLOCK_TABLE_VERSION,
    BlockLatencyTable,
    measure_subnet,
    table_error,
)
from edgesplit.nas.adaptivenet.loads import CpuLoad, ManualClock, SimulatedLatency, Slowdown
from edgesplit.nas.adaptivenet.monitor import LatencyMonitor, SwitchEvent
from edgesplit.nas.adaptivenet.placement import JointLatency, SplitChoice, plan_subnet
from edgesplit.nas.adaptivenet.pool import PoolEntry, PoolFileError, SubnetPool
from edgesplit.nas.adaptivenet.prune import channel_groups, prune_channels
from edgesplit.nas.adaptivenet.runner import AdaptiveRunner, Reply, RequestRecord
from edgesplit.nas.adaptivenet.search import (
    AdaptiveSearch,
    AnnealingSearch,
    EvolutionBaseline,
    SearchStep,
)
from edgesplit.nas.adaptivenet.space import Branch, ElasticSpace, SubnetArch, branch_name
from edgesplit.nas.adaptivenet.supernet import ElasticSupernet, Subnet
from edgesplit.nas.adaptivenet.train import ElasticTrainer, latency_range_accuracy

__all__ = [
    "BLOCK_TABLE_VERSION",
    "AdaptiveRunner",
    "AdaptiveSearch",
    "AnnealingSearch",
    "Block",
    "BlockLatencyTable",
    "BlockSplit",
    "Branch",
    "CpuLoad",
    "ElasticConfig",
    "ElasticData",
    "ElasticSpace",
    "ElasticSupernet",
    "ElasticTrainer",
    "EvalStats",
    "EvolutionBaseline",
    "JointLatency",
    "LatencyMonitor",
    "ManualClock",
    "NearbyBreeder",
    "PoolEntry",
    "PoolFileError",
    "PrefixTree",
    "PrefixTreeEvaluator",
    "Reply",
    "RequestRecord",
    "SearchStep",
    "SimulatedLatency",
    "Slowdown",
    "SplitChoice",
    "Subnet",
    "SubnetArch",
    "SubnetPool",
    "SwitchEvent",
    "UniformBreeder",
    "branch_name",
    "build_supernet",
    "channel_groups",
    "cosine",
    "elastify",
    "find_blocks",
    "latency_range_accuracy",
    "load_elastic_data",
    "load_supernet",
    "measure_reuse",
    "measure_subnet",
    "plan_subnet",
    "prune_channels",
    "save_supernet",
    "table_error",
    "top1",
]

"""AdaptiveNet (paper 003): elastify a pretrained model into a supernet, search it on the
device with a block latency table and a prefix cache, and switch subnets at run time.

- :mod:`.blocks`: basic blocks of any captured model (single main tensor in and out);
- :mod:`.branch`, :mod:`.prune`: a block as a module owning its weights; structured pruning on
  its FX graph (the shrunk blocks);
- :mod:`.space`, :mod:`.supernet`, :mod:`.elastify`: branches and subnets (paths), the
  supernet, and elastification (merged and shrunk branches).
"""

from edgesplit.nas.adaptivenet.blocks import Block, BlockSplit, find_blocks
from edgesplit.nas.adaptivenet.elastify import ElasticConfig, elastify
from edgesplit.nas.adaptivenet.prune import channel_groups, prune_channels
from edgesplit.nas.adaptivenet.space import Branch, ElasticSpace, SubnetArch, branch_name
from edgesplit.nas.adaptivenet.supernet import ElasticSupernet, Subnet

__all__ = [
    "Block",
    "BlockSplit",
    "Branch",
    "ElasticConfig",
    "ElasticSpace",
    "ElasticSupernet",
    "Subnet",
    "SubnetArch",
    "branch_name",
    "channel_groups",
    "elastify",
    "find_blocks",
    "prune_channels",
]

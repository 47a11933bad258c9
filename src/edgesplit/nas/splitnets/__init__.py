"""SplitNets (paper 004): a split-aware supernet searched together with where it splits, for
V sensors and one aggregator (a head-mounted system).

- :mod:`.space`: the search space (Table 7 scaled to small inputs) and an architecture;
- :mod:`.dynamic`, :mod:`.supernet`: elastic layers, split-aware initialisation (Table 3),
  Conv-Reduce / Conv-Recover / View-Fuse, and the plain network of one architecture;
- :mod:`.sampling`: the five-subnet and sandwich training samplers (appendix D), mutation and
  crossover;
- :mod:`.train`: stage 1, supernet training, and sub-network accuracy;
- :mod:`.cost`: T_sen + T_comm + T_agg and the sensor's peak memory without capturing;
- :mod:`.checkpoint`: a trained supernet in a folder;
- :mod:`.search`: stage 2, evolution under the sensor memory with a soft latency objective;
- :mod:`.result`: a searched network as model + plan; :mod:`.run`: both stages for the CLI;
- :mod:`.catalog`: the built-in spaces (``digits-split``, ``shapes-split``).
"""

from edgesplit.nas.splitnets.catalog import (
    get_split_space,
    list_split_spaces,
    register_split_space,
    resolve_split_space,
)
from edgesplit.nas.splitnets.checkpoint import load_supernet, save_supernet
from edgesplit.nas.splitnets.cost import (
    FLOAT32,
    PAPER,
    PRICINGS,
    SplitCost,
    SplitHardware,
    SplitPricing,
    split_layers,
)
from edgesplit.nas.splitnets.dynamic import INIT_MODES, init_std
from edgesplit.nas.splitnets.sampling import (
    SAMPLERS,
    SplitBreeder,
    crossover_split,
    mutate_split,
    random_split_arch,
    training_subnets,
)
from edgesplit.nas.splitnets.search import SplitNetsSearch
from edgesplit.nas.splitnets.space import PhaseArch, PhaseSpec, SplitArch, SplitSpace
from edgesplit.nas.splitnets.supernet import (
    SplitNet,
    SplitSupernet,
    interlace,
    recalibrate,
)
from edgesplit.nas.splitnets.train import SupernetTrainer, calibration_batches, subnet_accuracy

__all__ = [
    "FLOAT32",
    "INIT_MODES",
    "PAPER",
    "PRICINGS",
    "SAMPLERS",
    "PhaseArch",
    "PhaseSpec",
    "SplitArch",
    "SplitBreeder",
    "SplitCost",
    "SplitHardware",
    "SplitNet",
    "SplitNetsSearch",
    "SplitPricing",
    "SplitSpace",
    "SplitSupernet",
    "SupernetTrainer",
    "calibration_batches",
    "crossover_split",
    "get_split_space",
    "init_std",
    "interlace",
    "list_split_spaces",
    "load_supernet",
    "mutate_split",
    "random_split_arch",
    "recalibrate",
    "register_split_space",
    "resolve_split_space",
    "save_supernet",
    "split_layers",
    "subnet_accuracy",
    "training_subnets",
]

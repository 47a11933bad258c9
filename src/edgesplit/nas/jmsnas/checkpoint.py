"""Save a searched network to a folder and load it back, without pickle.

A folder holds ``arch.json`` (format version, the full search space, the architecture, a mesh
network's branch layout) and ``weights.safetensors`` (the state dict of the :class:`ArchNet`),
in the checkpoint layout every NAS system shares (:mod:`edgesplit.nas.core.checkpoint`). The
space is written out in full rather than by registry name, so a network still loads after a
built-in space changes or in a process that never registered it.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from edgesplit.errors import ConfigError, EdgesplitError
from edgesplit.nas.core.checkpoint import CheckpointFormat
from edgesplit.nas.jmsnas.network import ArchNet
from edgesplit.nas.jmsnas.space import Arch, SearchSpace

if TYPE_CHECKING:
    from edgesplit.nas.jmsnas.branched import BranchLayout

__all__ = ["ARCH_FILE", "FORMAT", "WEIGHTS_FILE", "load_network", "read_arch", "save_network"]

FORMAT = "edgesplit.nas.network/1"  # bump when the folder layout or arch.json changes
ARCH_FILE = "arch.json"
WEIGHTS_FILE = "weights.safetensors"
_RESAVE = "save the network again with save_network"
NETWORK = CheckpointFormat(FORMAT, ARCH_FILE, WEIGHTS_FILE, "network", _RESAVE, _RESAVE)


def save_network(folder: str | Path, net: ArchNet) -> Path:
    """Write ``net`` (its space, architecture and weights) into ``folder``, created if needed."""
    doc: dict[str, Any] = {"space": net.space.to_dict(), "arch": net.arch.to_dict()}
    layout = getattr(net, "layout", None)  # a BranchedArchNet: its slots run in parallel
    if layout is not None:
        doc["layout"] = layout.to_dict()
    state = {k: v.detach().to("cpu").contiguous() for k, v in net.state_dict().items()}
    return NETWORK.save(folder, doc, state)


def read_arch(folder: str | Path) -> tuple[SearchSpace, Arch]:
    """The space and architecture stored in ``folder``'s arch.json (the weights untouched)."""
    _, space, arch = _read(folder)
    return space, arch


def _read(folder: str | Path) -> tuple[dict[str, Any], SearchSpace, Arch]:
    doc = NETWORK.read(folder)
    try:
        space = SearchSpace.from_dict(doc["space"])
        return doc, space, space.validate(Arch.from_dict(doc["arch"]))
    except (KeyError, EdgesplitError) as exc:
        raise ConfigError(f"{str(Path(folder) / ARCH_FILE)!r} holds no valid space and "
                          f"architecture: {exc}") from None


def load_network(folder: str | Path) -> ArchNet:
    """The network saved in ``folder``, in eval mode, on the CPU."""
    doc, space, arch = _read(folder)
    state = NETWORK.load_state(folder, _expected_state(space, arch), fits="architecture")
    layout = _layout(folder, doc)
    if layout is None:
        return ArchNet.from_state_dict(space, arch, state).eval()
    from edgesplit.nas.jmsnas.branched import BranchedArchNet

    with torch.device("meta"):
        net = BranchedArchNet(space, arch, layout)
    net = net.to_empty(device="cpu")
    net.load_state_dict(state, strict=True)
    return net.eval()


def _layout(folder: str | Path, doc: dict[str, Any]) -> BranchLayout | None:
    """The BranchLayout stored next to the architecture, or None for a chain network."""
    from edgesplit.nas.jmsnas.branched import BranchLayout

    if "layout" not in doc:
        return None
    try:
        return BranchLayout.from_dict(doc["layout"])
    except (KeyError, TypeError, ValueError, EdgesplitError) as exc:
        raise ConfigError(f"{str(Path(folder) / ARCH_FILE)!r} holds no valid branch layout: "
                          f"{exc}") from None


def _expected_state(space: SearchSpace, arch: Arch) -> dict[str, torch.Tensor]:
    with torch.device("meta"):  # shapes and dtypes only: nothing is allocated or initialised
        return ArchNet(space, arch).state_dict()

"""Save a searched network to a folder and load it back, without pickle.

A folder holds ``arch.json`` (format version, the full search space, the architecture) and
``weights.safetensors`` (the state dict of the :class:`ArchNet`). The space is written out in
full rather than by registry name, so a network still loads after a built-in space changes or
in a process that never registered it. Loading checks every file before building anything and
raises :class:`~edgesplit.errors.ConfigError` naming the file and what is wrong with it.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from edgesplit.errors import ConfigError, EdgesplitError
from edgesplit.nas.core.files import read_document, read_json, write_json
from edgesplit.nas.jmsnas.network import ArchNet
from edgesplit.nas.jmsnas.space import Arch, SearchSpace

if TYPE_CHECKING:
    from edgesplit.nas.jmsnas.branched import BranchLayout

__all__ = ["ARCH_FILE", "FORMAT", "WEIGHTS_FILE", "load_network", "read_arch", "save_network"]

FORMAT = "edgesplit.nas.network/1"  # bump when the folder layout or arch.json changes
ARCH_FILE = "arch.json"
WEIGHTS_FILE = "weights.safetensors"


def save_network(folder: str | Path, net: ArchNet) -> Path:
    """Write ``net`` (its space, architecture and weights) into ``folder``, created if needed."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    doc = {"format": FORMAT, "space": net.space.to_dict(), "arch": net.arch.to_dict()}
    layout = getattr(net, "layout", None)  # a BranchedArchNet: its slots run in parallel
    if layout is not None:
        doc["layout"] = layout.to_dict()
    write_json(folder / ARCH_FILE, doc)
    state = {k: v.detach().to("cpu").contiguous() for k, v in net.state_dict().items()}
    save_file(state, str(folder / WEIGHTS_FILE), metadata={"format": FORMAT})
    return folder


def read_arch(folder: str | Path) -> tuple[SearchSpace, Arch]:
    """The space and architecture stored in ``folder``'s arch.json (the weights untouched)."""
    path = Path(folder) / ARCH_FILE
    doc = read_document(folder, ARCH_FILE, what="network", expected_format=FORMAT,
                        fix="save the network again with save_network")
    try:
        space = SearchSpace.from_dict(doc["space"])
        return space, space.validate(Arch.from_dict(doc["arch"]))
    except (KeyError, EdgesplitError) as exc:
        raise ConfigError(f"{str(path)!r} holds no valid space and architecture: {exc}") from None


def load_network(folder: str | Path) -> ArchNet:
    """The network saved in ``folder``, in eval mode, on the CPU."""
    space, arch = read_arch(folder)
    path = Path(folder) / WEIGHTS_FILE
    if not path.is_file():
        raise ConfigError(f"{str(path)!r} does not exist: the folder holds an architecture "
                          "but no weights; save it with save_network")
    try:
        state = load_file(str(path), device="cpu")
    except (SafetensorError, OSError, ValueError) as exc:
        raise ConfigError(f"{str(path)!r} is not a readable safetensors file ({exc}); save "
                          "the network again with save_network") from None
    _check_state(path, _expected_state(space, arch), state)
    layout = _read_layout(folder)
    if layout is None:
        return ArchNet.from_state_dict(space, arch, state).eval()
    from edgesplit.nas.jmsnas.branched import BranchedArchNet

    with torch.device("meta"):
        net = BranchedArchNet(space, arch, layout)
    net = net.to_empty(device="cpu")
    net.load_state_dict(state, strict=True)
    return net.eval()


def _read_layout(folder: str | Path) -> BranchLayout | None:
    """The BranchLayout stored next to the architecture, or None for a chain network."""
    from edgesplit.nas.jmsnas.branched import BranchLayout

    doc = read_json(Path(folder) / ARCH_FILE, what="network",
                    fix="save the network again with save_network")
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


def _check_state(path: Path, expected: dict[str, torch.Tensor],
                 state: dict[str, torch.Tensor]) -> None:
    problems: list[str] = []
    missing = sorted(expected.keys() - state.keys())
    unexpected = sorted(state.keys() - expected.keys())
    if missing:
        problems.append(f"missing {_few(missing)}")
    if unexpected:
        problems.append(f"unexpected {_few(unexpected)}")
    for key in sorted(expected.keys() & state.keys()):
        want, got = expected[key], state[key]
        if want.shape != got.shape or want.dtype != got.dtype:
            problems.append(f"{key} is {_describe(got)}, expected {_describe(want)}")
    if problems:
        raise ConfigError(f"{str(path)!r} does not match the architecture in {ARCH_FILE}: "
                          f"{'; '.join(problems[:5])}; save the network again with "
                          "save_network")


def _few(keys: list[str]) -> str:
    return ", ".join(keys[:3]) + (f" and {len(keys) - 3} more" if len(keys) > 3 else "")


def _describe(t: torch.Tensor) -> str:
    return f"{str(t.dtype).replace('torch.', '')}{list(t.shape)}"

"""What device and server of split training agree on: the protocol's version and constants,
the model's fingerprint and what crosses each cut, the message limit, and the checks every
tensor that arrives passes (name, shape, dtype, finite) before anything of it is used.

Both sides keep a full copy of the chain, built from the same factory and seed (``Hello``
checks a SHA-256 fingerprint, :func:`model_fingerprint`), and a ``base`` snapshot of the
parameters taken at the last sync. A sync over chain elements S sends, per element, ``params -
base`` from each side that trained it since the last sync; both sides then set ``params = base
+ delta_device + delta_server`` (no update is lost; both compute it in the same order, so the
copies stay bit-identical; a side that alone trained an element sends its parameters
themselves, i.e. base + delta without float32 rounding, at the same size) and the element's
owner under the last round's cut sends its buffers (batch-norm statistics) and its SGD
momentum (``optim:<parameter>`` entries, :data:`OPTIM_PREFIX`), which only the owner keeps
current (a side taking over an element with a momentum from long ago would push it with stale
gradients). Two policies (:data:`SYNC_POLICIES`):

* ``fws`` (L2S-FWS): when the cut changes, the elements that change sides are synced before
  the round. No element is then trained on both sides between syncs, so this is exactly
  unsplit training (SGD with or without momentum).
* ``periodic`` (L2S): cut changes send nothing, each side trains its possibly stale copy;
  every ``sync_every`` rounds and on
  :meth:`~edgesplit.train.remote.client.RemoteSplitTrainer.sync_now`, the elements trained on
  both sides since the last sync are merged.

One element's state travels as a ``LayerState`` (:func:`layer_msg` writes one,
:func:`read_layer` reads and checks one against the receiving side's module).
"""

from __future__ import annotations

import copy
import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from edgesplit.errors import ConfigError, WireError, option
from edgesplit.quant.wire import decode_tensor, encode_tensor, message_info
from edgesplit.train.proto import edgesplit_train_pb2 as pb

__all__ = ["DEFAULT_MAX_BATCH", "OPTIM_PREFIX", "PROTOCOL_VERSION", "SYNC_POLICIES",
           "ChainShapes", "Tensors", "Update", "batch_size", "chain_shapes", "check_finite",
           "decode_as", "layer_msg", "model_fingerprint", "read_layer", "train_message_bytes"]

PROTOCOL_VERSION = 3  # 2: sessions, limits in HelloReply, Close; 3: sequence numbers, Undo
SYNC_POLICIES = ("periodic", "fws")
OPTIM_PREFIX = "optim:"  # buffer entries that carry an element's SGD momentum
DEFAULT_MAX_BATCH = 256
Tensors = dict[str, torch.Tensor]
Update = tuple[Tensors, bool]  # (params or deltas by name, absolute)


def model_fingerprint(chain: Sequence[nn.Module]) -> str:
    """SHA-256 of every parameter and buffer of ``chain`` (names, dtypes, shapes, values)."""
    h = hashlib.sha256()
    for i, module in enumerate(chain):
        for name, t in module.state_dict().items():
            t = t.detach().cpu().contiguous()
            h.update(f"{i}.{name}:{t.dtype}:{tuple(t.shape)};".encode())
            h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


@dataclass(frozen=True)
class ChainShapes:
    """What crosses each cut of a chain, per sample: ``cuts[c + 1]`` is the (shape, dtype)
    element ``c`` outputs (``cuts[0]``: the model input), and the number of classes."""

    cuts: tuple[tuple[tuple[int, ...], torch.dtype], ...]
    classes: int


def chain_shapes(chain: Sequence[nn.Module], sample_shape: Sequence[int],
                 dtype: torch.dtype = torch.float32) -> ChainShapes:
    """Run one zero sample through a copy of ``chain`` (eval mode: batch-norm needs no batch
    and keeps its statistics) and record every cut's shape and dtype."""
    layers = copy.deepcopy(list(chain))
    x = torch.zeros(1, *sample_shape, dtype=dtype)
    cuts = [(tuple(int(d) for d in sample_shape), dtype)]
    with torch.no_grad():
        for i, layer in enumerate(layers):
            try:
                x = layer.eval()(x)
            except (RuntimeError, ValueError, IndexError) as exc:
                raise ConfigError(f"a sample of shape {list(sample_shape)} does not fit the "
                                  f"model (chain element {i}: {str(exc).splitlines()[0]}); "
                                  "give the shape of one input sample, without the batch "
                                  "dimension") from None
            cuts.append((tuple(x.shape[1:]), x.dtype))
    if x.dim() != 2 or x.shape[1] < 1:
        raise ConfigError(f"the model outputs {list(x.shape[1:])} per sample; split training "
                          "needs class logits [classes] for the cross-entropy loss")
    return ChainShapes(tuple(cuts), int(x.shape[1]))


def train_message_bytes(chain: Sequence[nn.Module], shapes: ChainShapes, max_batch: int) -> int:
    """The largest message split training of ``chain`` can need, like the inference server's
    ``max_message_bytes``: a Step of ``max_batch`` samples at the widest cut (activation at
    float32 and int64 labels; the gradient comes back at the activation's size), or a Sync or
    Fetch of every element's parameters (or deltas), buffers and momentum. gRPC refuses
    anything larger (RESOURCE_EXHAUSTED) before it reaches a handler."""
    widest = max(math.prod(shape) * 4 for shape, _ in shapes.cuts[:-1])
    step = max_batch * (widest + 8) + 2 * 256
    state = 0
    for module in chain:
        for p in module.parameters():
            state += 2 * (p.numel() * max(p.element_size(), 4) + 256)  # params + momentum
        for b in module.buffers():
            state += b.numel() * max(b.element_size(), 4) + 256
        state += 64
    return max(64 * 1024, int(max(step, state) * 1.25) + 16 * 1024)


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def check_finite(t: torch.Tensor, what: str) -> None:
    if t.is_floating_point() and not bool(torch.isfinite(t).all()):
        raise WireError(f"{what} has NaN or infinite values (training diverged or the data is "
                        "corrupt; lower the learning rate or clean the data)")


def decode_as(data: bytes, what: str, shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
    """Decode a tensor that must have ``shape`` and ``dtype`` and be finite; the decoder checks
    the header first, so a message claiming another shape is refused before anything of its
    size is allocated."""
    try:
        t = decode_tensor(data, expect_shape=tuple(shape), expect_dtype=dtype)
    except WireError as exc:
        raise WireError(f"{what} must be {_dtype_name(dtype)} of shape {list(shape)}: {exc}"
                        ) from None
    check_finite(t, what)
    return t


def batch_size(data: bytes, what: str, sample: Sequence[int], dtype: torch.dtype,
                max_batch: int, hint: str) -> int:
    """The batch size of an activation message whose header must read [batch, *sample]."""
    try:
        info = message_info(data)
    except WireError as exc:
        raise WireError(f"{what}: {exc}") from None
    shape = info["shape"]
    if info["dtype"] != _dtype_name(dtype) or len(shape) != len(sample) + 1 \
            or shape[1:] != list(sample):
        raise WireError(f"{what} must be {_dtype_name(dtype)} of shape [batch, "
                        f"{', '.join(map(str, sample))}] ({hint}), got {info['dtype']} of shape "
                        f"{shape}; cut the same model at the same place on both sides")
    if shape[0] == 0:
        raise WireError(f"{what} is an empty batch: a round trains on at least one sample")
    if shape[0] > max_batch:
        raise WireError(f"{what} has a batch of {shape[0]} samples; this server trains on 1 to "
                        f"{max_batch} per round (send smaller batches, or restart "
                        f"serve-training with a larger {option('max_batch')})")
    return shape[0]


def read_layer(msg: pb.LayerState, module: nn.Module) -> tuple[Update, Tensors]:
    """The (update, buffers) a LayerState carries for ``module``, every tensor checked for
    name, shape, dtype and finiteness; raises WireError naming the first problem."""
    i, params_own = msg.index, dict(module.named_parameters())
    buffers_own = dict(module.named_buffers())
    params: Tensors = {}
    for t in msg.params:
        own = params_own.get(t.name)
        if own is None or t.name in params:
            raise WireError(f"element {i} has no parameter {t.name!r} (or it was sent twice); "
                            f"its parameters are {sorted(params_own)}")
        params[t.name] = decode_as(t.data, f"element {i} parameter {t.name!r}", own.shape,
                                    own.dtype)
    if params and set(params) != set(params_own):
        raise WireError(f"element {i} has parameters {sorted(params_own)}, got {sorted(params)}: "
                        "send all of them or none")
    buffers: Tensors = {}
    for t in msg.buffers:
        name = t.name.removeprefix(OPTIM_PREFIX)
        like = params_own.get(name) if t.name.startswith(OPTIM_PREFIX) else buffers_own.get(name)
        if like is None or t.name in buffers:
            raise WireError(f"element {i} has no buffer {t.name!r} (or it was sent twice); its "
                            f"buffers are {sorted(buffers_own)}, with optimizer state "
                            f"{OPTIM_PREFIX}<parameter>")
        buffers[t.name] = decode_as(t.data, f"element {i} buffer {t.name!r}", like.shape,
                                     like.dtype)
    plain = {k for k in buffers if not k.startswith(OPTIM_PREFIX)}
    if plain and plain != set(buffers_own):
        raise WireError(f"element {i} has buffers {sorted(buffers_own)}, got {sorted(plain)}: "
                        "send all of them or none")
    return (params, msg.absolute), buffers



def layer_msg(index: int, update: Update | None, buffers: Tensors | None) -> pb.LayerState:
    params, absolute = update or ({}, False)
    msg = pb.LayerState(index=index, absolute=absolute)
    for name, t in params.items():
        msg.params.add(name=name, data=encode_tensor(t, 32))
    for name, t in (buffers or {}).items():
        msg.buffers.add(name=name, data=encode_tensor(t, 32))
    return msg

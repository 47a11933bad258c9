"""Devices: what a processor can compute, how fast, at which precisions, with how much memory.

Two compute models. *Analytical*: a roofline from peak operations per second per bit-width and
off-chip memory bandwidth (optionally faster for working sets that fit a cache: memory tiers),
with a per-op-class efficiency and a fixed per-layer overhead.
*Measured*: a per-layer profile table written by ``edgesplit profile``.

Bit-widths (AUTO-SPLIT section 5.1): a layer computed at b bits runs at the peak of the narrowest
native precision that holds b bits, so sub-8-bit layers on INT8 hardware gain nothing in MACs;
they do move fewer bytes, which the memory term of the roofline sees.
"""

from __future__ import annotations

from itertools import pairwise
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PositiveFloat,
    PositiveInt,
    SerializerFunctionWrapHandler,
    field_validator,
    model_serializer,
    model_validator,
)

from edgesplit.units import parse_bytes

__all__ = ["DEVICE_KINDS", "OP_CLASSES", "AnalyticalCompute", "Device", "MeasuredCompute",
           "MemoryTier", "WireCodec", "serialize_ms"]

DEVICE_KINDS = ("cpu", "gpu", "npu", "accelerator", "soc", "mcu")
# Op classes the efficiency table and the regression estimator distinguish (see graph.ops).
OP_CLASSES = ("conv", "dwconv", "matmul", "attention", "pool", "norm", "elementwise",
              "embedding", "view", "other")

_STRICT = ConfigDict(frozen=True, extra="forbid")


def _size(value: Any) -> Any:
    """A size as people write it in a file ("2MiB", "64MB") in bytes; anything else as is."""
    return parse_bytes(value, "memory size") if isinstance(value, str) else value


Bytes = Annotated[PositiveInt, BeforeValidator(_size)]


class MemoryTier(BaseModel):
    """A level of the memory hierarchy as a layer sees it: working sets of at most ``max_bytes``
    stream at ``bandwidth_gb_per_s`` (e.g. a cache; measured by streaming a buffer that size)."""

    model_config = _STRICT

    max_bytes: PositiveInt = Field(description="largest working set (bytes) this tier holds")
    bandwidth_gb_per_s: PositiveFloat = Field(
        description="bandwidth of a working set that fits, in gigabytes per second")


class AnalyticalCompute(BaseModel):
    """Roofline model: latency = max(ops / (peak x efficiency), bytes / bandwidth) + overhead."""

    model_config = _STRICT

    model: Literal["analytical"] = "analytical"
    peak_gops: dict[PositiveInt, PositiveFloat] = Field(
        description="peak giga-operations per second (1 MAC = 2 ops) by native bit-width, "
                    "e.g. {8: 34.0} for an INT8 accelerator or {16: 1800, 32: 900} for a GPU")
    memory_bandwidth_gb_per_s: PositiveFloat = Field(
        description="off-chip memory bandwidth in gigabytes per second")
    efficiency: dict[str, Annotated[float, Field(gt=0, le=1)]] = Field(
        default_factory=dict,
        description=f"fraction of peak reached per op class ({', '.join(OP_CLASSES)})")
    default_efficiency: Annotated[float, Field(gt=0, le=1)] = Field(
        0.5, description="fraction of peak for op classes not listed in `efficiency`")
    layer_overhead_ms: Annotated[float, Field(ge=0)] = Field(
        0.0, description="fixed cost per layer (kernel launch, dispatch)")
    memory_tiers: tuple[MemoryTier, ...] = Field(
        (), description="faster levels (caches) by working-set size, smallest first: a layer "
                        "whose working set fits a tier streams at its bandwidth, a larger one at "
                        "memory_bandwidth_gb_per_s; empty = one bandwidth for every layer")

    @model_validator(mode="after")
    def _known_classes(self) -> AnalyticalCompute:
        unknown = sorted(set(self.efficiency) - set(OP_CLASSES))
        if unknown:
            raise ValueError(f"unknown op class(es) {unknown} in efficiency; known: "
                             f"{', '.join(OP_CLASSES)}")
        return self

    @model_validator(mode="after")
    def _tiers_ordered(self) -> AnalyticalCompute:
        # a larger working set never streams faster: tiers grow in size, shrink in bandwidth,
        # and none is slower than off-chip memory (catches swapped or mis-sorted entries)
        sizes = [t.max_bytes for t in self.memory_tiers]
        rates = [t.bandwidth_gb_per_s for t in self.memory_tiers] + [
            self.memory_bandwidth_gb_per_s]
        if any(a >= b for a, b in pairwise(sizes)):
            raise ValueError(f"memory_tiers must grow in max_bytes, smallest first: {sizes}")
        if any(a < b for a, b in pairwise(rates)):
            raise ValueError("memory_tiers' bandwidths must not grow with max_bytes, nor fall "
                             f"below memory_bandwidth_gb_per_s: {rates} GB/s")
        return self

    @model_serializer(mode="wrap")
    def _without_empty_tiers(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # a device without tiers dumps exactly as before they existed: its files still load in
        # older versions and its fingerprint (nas latency tables are keyed by it) is unchanged
        data: dict[str, Any] = handler(self)
        if not self.memory_tiers:
            data.pop("memory_tiers", None)
        return data

    def bandwidth_for(self, working_set_bytes: float) -> float:
        """The bandwidth a layer touching ``working_set_bytes`` streams at: that of the smallest
        tier holding it, else the off-chip ``memory_bandwidth_gb_per_s``."""
        for tier in self.memory_tiers:
            if working_set_bytes <= tier.max_bytes:
                return tier.bandwidth_gb_per_s
        return self.memory_bandwidth_gb_per_s

    def compute_bits(self, bits: int) -> int:
        """The native precision a ``bits``-bit layer runs at (narrowest native width >= bits,
        else the widest)."""
        wide_enough = [b for b in self.peak_gops if b >= bits]
        return min(wide_enough) if wide_enough else max(self.peak_gops)


class MeasuredCompute(BaseModel):
    """Per-layer latencies measured on the device (a profile written by ``edgesplit profile``)."""

    model_config = _STRICT

    model: Literal["measured"] = "measured"
    profile: str = Field(description="path to a profile JSON file; relative paths are resolved "
                                     "against the device file's folder")


class WireCodec(BaseModel):
    """How fast the device encodes and decodes tensors in the wire format (docs/wire-format.md):
    a fixed cost per tensor plus the tensor's bytes *as computed* (a float32 activation: 4 bytes
    per element, whatever width it travels at) over a throughput. ``quantized_*`` apply to
    tensors sent at 8 bits or fewer (quantizing and packing reads every float; 16 and 32 bits
    are a cast or a copy). ``edgesplit profile --calibrate`` measures these for this machine."""

    model_config = _STRICT

    encode_gb_per_s: PositiveFloat
    decode_gb_per_s: PositiveFloat
    quantized_encode_gb_per_s: PositiveFloat
    quantized_decode_gb_per_s: PositiveFloat
    encode_tensor_ms: Annotated[float, Field(ge=0)] = 0.02
    decode_tensor_ms: Annotated[float, Field(ge=0)] = 0.02
    source: str = ""

    def encode_ms(self, nbytes: float, quantized: bool = False) -> float:
        rate = self.quantized_encode_gb_per_s if quantized else self.encode_gb_per_s
        return self.encode_tensor_ms + nbytes / (rate * 1e9) * 1e3

    def decode_ms(self, nbytes: float, quantized: bool = False) -> float:
        rate = self.quantized_decode_gb_per_s if quantized else self.decode_gb_per_s
        return self.decode_tensor_ms + nbytes / (rate * 1e9) * 1e3


# Without a measured codec, a device encodes at a fraction of its memory bandwidth: the wire
# format copies the payload and checksums it (about 0.75 of a 4.8 GB/s copy on the 2-core
# x86 machine we measured), quantizing takes several passes over the floats (about 0.35).
# Devices without a bandwidth (a measured profile) get a laptop-class host's.
_RAW_SHARE, _QUANT_SHARE, _HOST_GB_PER_S = 0.75, 0.35, 5.0


def _default_codec(device: Device) -> WireCodec:
    compute = device.compute
    bandwidth = (compute.memory_bandwidth_gb_per_s if isinstance(compute, AnalyticalCompute)
                 else _HOST_GB_PER_S)
    return WireCodec(encode_gb_per_s=_RAW_SHARE * bandwidth,
                     decode_gb_per_s=_RAW_SHARE * bandwidth,
                     quantized_encode_gb_per_s=_QUANT_SHARE * bandwidth,
                     quantized_decode_gb_per_s=_RAW_SHARE * bandwidth,
                     source="default: a share of the memory bandwidth")


class Device(BaseModel):
    """A processor that can run layers. Memory sizes are in bytes."""

    model_config = _STRICT

    name: str = Field(min_length=1)
    kind: Literal["cpu", "gpu", "npu", "accelerator", "soc", "mcu"]
    compute: AnalyticalCompute | MeasuredCompute = Field(discriminator="model")
    memory_bytes: Bytes | None = Field(
        None, description="memory available to run a model (off-chip DRAM); None = unbounded; "
                          "bytes, or a size such as 2MiB")
    on_chip_memory_bytes: Bytes | None = Field(None, description="on-chip SRAM/buffer")
    supported_bits: tuple[PositiveInt, ...] = Field(
        (8, 16, 32), description="bit-widths weights and activations may be quantized to")
    description: str = ""
    source: str = Field("", description="where the numbers come from")
    wire: WireCodec | None = Field(
        None, description="wire-format encode/decode speed; None = a share of the memory "
                          "bandwidth (see codec)")

    def codec(self) -> WireCodec:
        """The device's wire codec speed: its own ``wire``, else the default."""
        return self.wire or _default_codec(self)

    @field_validator("compute", mode="before")
    @classmethod
    def _default_model(cls, value: object) -> object:
        # Files may leave out `model`: a table with a profile is measured, else analytical.
        if isinstance(value, dict) and "model" not in value:
            return {**value, "model": "measured" if "profile" in value else "analytical"}
        return value

    @model_validator(mode="after")
    def _bits_sorted(self) -> Device:
        if any(b > 32 for b in self.supported_bits):
            raise ValueError("supported_bits must be at most 32")
        return self


def serialize_ms(src: Device, dst: Device, nbytes: float, quantized: bool = False) -> float:
    """Encoding one tensor of ``nbytes`` (as computed) on ``src`` and decoding it on ``dst``:
    the CPU time a crossing tensor costs besides the link (every plan adds it per tensor per
    link, docs/cost-model.md)."""
    return src.codec().encode_ms(nbytes, quantized) + dst.codec().decode_ms(nbytes, quantized)

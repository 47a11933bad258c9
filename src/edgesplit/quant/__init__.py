"""Quantization of the edge part and the wire format of tensors crossing a link.

The wire format (``encode_tensor`` / ``decode_tensor``) with dense sub-8-bit packing; fake-quant
of an edge part with calibration (``fake_quant_program``, and ``QuantizableProgram`` to switch
widths without copying); distortion tables; bit allocation under a memory budget; and
``QualityMeter``, the real accuracy of a partly quantized model on held-out data. These are
analyses the planners (``edgesplit.plan``, AUTO-SPLIT) build on.
"""

from edgesplit.quant.accuracy import Quality, QualityMeter
from edgesplit.quant.allocation import Allocation, allocate_bits
from edgesplit.quant.fakequant import (
    Calibration,
    DistortionTable,
    QuantizableProgram,
    calibrate,
    distortion_table,
    fake_quant_program,
    fake_quantize,
    quantize_weight,
)
from edgesplit.quant.pack import pack_bits, packed_size, unpack_bits
from edgesplit.quant.wire import (
    MAX_DIM,
    MAX_ELEMENTS,
    MAX_NDIM,
    WIRE_VERSION,
    decode_tensor,
    encode_tensor,
    message_info,
)

__all__ = [
    "MAX_DIM",
    "MAX_ELEMENTS",
    "MAX_NDIM",
    "WIRE_VERSION",
    "Allocation",
    "Calibration",
    "DistortionTable",
    "Quality",
    "QualityMeter",
    "QuantizableProgram",
    "allocate_bits",
    "calibrate",
    "decode_tensor",
    "distortion_table",
    "encode_tensor",
    "fake_quant_program",
    "fake_quantize",
    "message_info",
    "pack_bits",
    "packed_size",
    "quantize_weight",
    "unpack_bits",
]

"""Quantization of the edge part and the wire format of tensors crossing a link.

So far: the wire format (``encode_tensor`` / ``decode_tensor``) with dense sub-8-bit packing,
fake-quant of an edge part with calibration and distortion tables, and bit allocation under a
memory budget. AUTO-SPLIT's planner (Algorithm 1) is the rest of its issue.
"""

from edgesplit.quant.allocation import Allocation, allocate_bits
from edgesplit.quant.fakequant import (Calibration, DistortionTable, calibrate, distortion_table,
                                       fake_quant_program, fake_quantize, quantize_weight)
from edgesplit.quant.pack import pack_bits, packed_size, unpack_bits
from edgesplit.quant.wire import (MAX_ELEMENTS, WIRE_VERSION, decode_tensor, encode_tensor,
                                  message_info)

__all__ = ["Allocation", "allocate_bits", "Calibration", "DistortionTable", "calibrate", "distortion_table",
           "fake_quant_program", "fake_quantize", "quantize_weight", "pack_bits", "packed_size", "unpack_bits", "MAX_ELEMENTS", "WIRE_VERSION",
           "decode_tensor", "encode_tensor", "message_info"]

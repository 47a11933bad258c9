"""Quantization of the edge part and the wire format of tensors crossing a link.

So far: the wire format (``encode_tensor`` / ``decode_tensor``) with dense sub-8-bit packing,
and fake-quant of an edge part with calibration and distortion tables. Bit allocation and
AUTO-SPLIT's planner are the rest of their issue.
"""

from edgesplit.quant.fakequant import (Calibration, DistortionTable, calibrate, distortion_table,
                                       fake_quant_program, fake_quantize, quantize_weight)
from edgesplit.quant.pack import pack_bits, packed_size, unpack_bits
from edgesplit.quant.wire import (MAX_ELEMENTS, WIRE_VERSION, decode_tensor, encode_tensor,
                                  message_info)

__all__ = ["Calibration", "DistortionTable", "calibrate", "distortion_table",
           "fake_quant_program", "fake_quantize", "quantize_weight", "pack_bits", "packed_size", "unpack_bits", "MAX_ELEMENTS", "WIRE_VERSION",
           "decode_tensor", "encode_tensor", "message_info"]

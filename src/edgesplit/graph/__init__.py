"""Capture a model into the LayerGraph IR and query it: layers with costs, tensors, cuts, memory."""

from edgesplit.graph.capture import (
    Exported,
    capture,
    check_input_shape,
    export_for_capture,
    export_model,
    is_model_file,
    load_program,
    optimize_program,
    parse_shape,
    saved_input_shape,
)
from edgesplit.graph.cuts import Cut, crossing_tensors, topological_cuts
from edgesplit.graph.ir import INPUT, OUTPUT, Layer, LayerGraph, OutputLeaf, TensorInfo
from edgesplit.graph.markers import split_point
from edgesplit.graph.memory import MemoryReport, peak_memory, prefix_peak_memory
from edgesplit.graph.model_file import ModelFileLimits, TrustedModelFile, unsafe_payloads
from edgesplit.graph.user_model import is_code_ref, resolve_code_ref

__all__ = [
    "INPUT",
    "OUTPUT",
    "Cut",
    "Exported",
    "Layer",
    "LayerGraph",
    "MemoryReport",
    "ModelFileLimits",
    "OutputLeaf",
    "TensorInfo",
    "TrustedModelFile",
    "capture",
    "check_input_shape",
    "crossing_tensors",
    "export_for_capture",
    "export_model",
    "is_code_ref",
    "is_model_file",
    "load_program",
    "optimize_program",
    "parse_shape",
    "peak_memory",
    "prefix_peak_memory",
    "resolve_code_ref",
    "saved_input_shape",
    "split_point",
    "topological_cuts",
    "unsafe_payloads",
]

"""Capture a model into the LayerGraph IR and query it: layers with costs, tensors, cuts, memory."""

from edgesplit.graph.capture import capture, export_model, load_program, optimize_program, parse_shape
from edgesplit.graph.model_file import TrustedModelFile, unsafe_payloads
from edgesplit.graph.cuts import Cut, crossing_tensors, topological_cuts
from edgesplit.graph.ir import INPUT, OUTPUT, Layer, LayerGraph, OutputLeaf, TensorInfo
from edgesplit.graph.memory import MemoryReport, peak_memory, prefix_peak_memory

__all__ = [
    "capture",
    "export_model",
    "load_program",
    "optimize_program",
    "parse_shape",
    "TrustedModelFile",
    "unsafe_payloads",
    "Cut",
    "crossing_tensors",
    "topological_cuts",
    "INPUT",
    "OUTPUT",
    "Layer",
    "LayerGraph",
    "OutputLeaf",
    "TensorInfo",
    "MemoryReport",
    "peak_memory",
    "prefix_peak_memory",
]

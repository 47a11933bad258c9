"""A lean Llama stage: its decoder layers as one ONNX Runtime graph over quantized weights and
a preallocated KV cache, one ``run`` per step.

Why a graph and not torch modules: a decode step of SmolLM2-135M spends 22 ms of its measured
60 ms in float32 linears and the rest in per-module Python and allocation (issue 53), and
torch 2.13's CPU int8/int4 matmuls are 6-14x slower than float32 at one token. One graph run
per step has no per-module Python, and ONNX Runtime's ``MatMulNBits`` computes straight from
the GGUF's 4- and 8-bit blocks (:mod:`edgesplit.llm.stage.quantized`).

The graph, per decoder layer (transformers' ``LlamaDecoderLayer``, the same arithmetic):

    a = SimplifiedLayerNormalization(x, attn_norm)                 # RMSNorm
    qkv = MatMulNBits(a, W_qkv)  (one product where the three share a type)
    o, K, V = GroupQueryAttention(qkv packed, K_cache, V_cache, rotary half-split)
    x = Sum(x, MatMulNBits(o, W_o))
    g, u = MatMulNBits(SimplifiedLayerNormalization(x, ffn_norm), W_gate_up)
    x = Sum(x, MatMulNBits(QuickGelu(g) * u, W_down))     # QuickGelu, alpha 1: silu

The residual stream ``x`` is a tensor of its own after every add (no add fused into the next
norm), so a stage boundary changes no arithmetic: MatMulNBits quantizes its input to int8
per block, and a last-bit difference there (a fused norm sums in another order) can move a
logit by 0.1 on a random model (measured). The embedding lookup runs outside the graph: the
rows of a step's tokens, dequantised from the GGUF's own bytes, mapped (a tied head's
initializer is the only copy the stage holds; a lookup makes only its rows' pages resident);
the head takes the last position only.

Memory: the graph's weights are written to a file as they are repacked, one tensor at a time,
and ONNX Runtime maps them from there into its prepacked copy, the one the stage keeps (no
protobuf copy of them, no serialized model); the GGUF is unmapped when the caller drops the
model, once the session is open.

Invariants: a stage's KV caches are one :class:`KVPool`, per layer a key and a value array
``[sessions, kv_heads, max_context + 1, head_dim]`` allocated once, a session one row of them
(a :class:`KVSlot`). A step of rows ``lo .. hi - 1`` writes each row's positions ``length ..
length + T - 1`` and attends to ``0 .. length + T - 1`` (GroupQueryAttention's shared
past/present buffer), so what lies past a session's length is never read and rewinding is
setting the length. Decode steps of several sessions run as one batch over the rows they span
(:meth:`OnnxStage.step_batch`): a row in that span whose session takes no part computes a
throw-away token at its own length, which writes one position past what it holds (hence the
``+ 1``) and changes nothing it will read. A step allocates only its outputs.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from edgesplit.errors import ConfigError
from edgesplit.llm.model.gguf import KERNEL_TYPES, GGUFModel, GGUFShape, QuantTensor
from edgesplit.llm.stage.kv_pool import KVPool, KVSlot
from edgesplit.llm.stage.quantized import BLOCK, NBitsWeight, float_weight, nbits_weight

__all__ = ["OnnxStage", "RowStep"]

log = logging.getLogger(__name__)
_MS = "com.microsoft"
# MatMulNBits' accuracy level per activations setting, weight bits and linear kind: 0
# computes in float32 from the 4-bit blocks, 4 quantizes the linear's input to int8 per
# block of 32 (MLAS's VNNI path, as llama.cpp's Q8_1). An 8-bit weight has no fast float32
# path in MLAS (it dequantises the matrix every call: 250 ms), so it runs int8 unless
# "exact" (tests) asks otherwise. "mixed" quantizes every input but qkv's: of the kinds
# computed in float alone, qkv lowers the divergence from float32 most per millisecond
# (mean KL 0.0044 -> 0.0034 nats for +0.5 ms a step; down 0.0037 for +0.8 ms, o 0.0043 for
# +0.3 ms, gate_up 0.0034 for +1.7 ms: each kind's MatMulNBits alone, at one token). Measured
# on SmolLM2 Q4_1 (a Q8_0 head), teacher forced: top-1 agreement over the first 300 / 500
# tokens of scikit-learn's twenty_newsgroups.rst (in brackets: 500 of kddcup99.rst), mean KL
# from float32 (500 tokens), a decode step's time against int8's and decode speed against
# llama.cpp's (node-llama-cpp 3.21.1, same GGUF), one thread, interleaved in one process
# with llama.cpp's process between rounds (each session's median over rounds of the 20th
# percentile step times' ratio; the machine shared, so the sessions are listed):
#
#   setting        with float32        with llama.cpp      KL      step   x llama.cpp
#   int8 (*)       94.3 / 94.0 %       93.7 / 93.6 %       0.0198  1.08   0.84, 0.90
#   int8           96.0 / 96.6 (97.8)  96.7 / 96.6 (95.8)  0.0044  1.00   0.92, 0.94, 0.96, 1.01
#   mixed          96.3 / 97.4 (97.4)  96.3 / 97.0 (95.8)  0.0034  1.04   0.99
#   float          98.3 / 98.6 (97.6)  96.7 / 97.2 (96.4)  0.0010  1.3    0.67, 0.72, 0.79
#   llama.cpp      96.3 / 97.4 (96.4)  -                   -       -      1
#
# (*) before: Q4_1 split as d q + m, not d (q - 8) + (m + 8 d) (stage/quantized.py says why
# the centred split is the better one with int8 inputs). The engines benchmark's quiet runs
# (bench_llm_engines.py) put that int8 at x1.15 llama.cpp's decode tokens/s at one thread
# and float at x0.81; by the step times above, int8 is now ~x1.24 and mixed ~x1.19.
# "mixed"'s extra agreement is within a few tokens of noise at these lengths; its KL is not.
LINEARS = ("qkv", "o", "gate_up", "down", "head")  # the graph's linears, by kind


def _every(level: int) -> dict[str, int]:
    return dict.fromkeys(LINEARS, level)


ACTIVATIONS: dict[str, dict[int, dict[str, int]]] = {
    "float": {4: _every(0), 8: _every(4)},
    "int8": {4: _every(4), 8: _every(4)},
    "mixed": {4: {**_every(4), "qkv": 0}, 8: _every(4)},
    "exact": {4: _every(0), 8: _every(0)},
}
_WEIGHTS = "weights.bin"  # the graph's prepacked weights, in a file beside it
_ALIGN = 4096  # their offsets there (pages: ONNX Runtime maps them)


@dataclass
class _Graph:
    """The graph under construction: nodes, initializers, inputs and outputs. A weight its
    kernel prepacks is written to ``weights`` (the file ``location`` beside the model) as it
    is made, its tensor pointing there: ONNX Runtime maps it, packs it into memory of its own
    and unmaps it, so no copy of it stays behind (measured: no mapping of the file is left
    once the session is open, so the file holds no memory after it is deleted, even on a
    tmpfs). Any other initializer (scales, zero points, norms: ONNX Runtime keeps them as
    they are) is small and stays in the model."""

    weights: BinaryIO
    location: str
    nodes: list[Any] = field(default_factory=list)
    initializers: list[Any] = field(default_factory=list)
    inputs: list[Any] = field(default_factory=list)
    outputs: list[Any] = field(default_factory=list)
    made: set[str] = field(default_factory=set)  # shared intermediate results made so far

    def node(self, op: str, inputs: list[str], outputs: list[str], domain: str = "",
             **attrs: Any) -> list[str]:
        from onnx import helper

        self.nodes.append(helper.make_node(op, inputs, outputs, domain=domain, **attrs))
        return outputs

    def const(self, name: str, array: np.ndarray, *, prepacked: bool = False) -> str:
        """Initializer ``name``; ``prepacked``: its kernel prepacks it (to the file)."""
        from onnx import TensorProto, helper, numpy_helper

        array = np.ascontiguousarray(array)
        if not prepacked:
            self.initializers.append(numpy_helper.from_array(array, name))
            return name
        offset = -(-self.weights.tell() // _ALIGN) * _ALIGN  # aligned as onnx.save aligns
        self.weights.seek(offset)
        self.weights.write(array.data)
        proto = TensorProto(name=name, dims=array.shape, data_location=TensorProto.EXTERNAL,
                            data_type=helper.np_dtype_to_tensor_dtype(array.dtype))
        for key, value in (("location", self.location), ("offset", offset),
                           ("length", array.nbytes)):
            proto.external_data.add(key=key, value=str(value))
        self.initializers.append(proto)
        return name


class OnnxStage:
    """Decoder layers ``[first, end)`` of a GGUF Llama, with the embedding (``embed``) and the
    head (``head``) where the stage holds them, run by ONNX Runtime on ``threads`` threads,
    with KV cache rows for ``sessions`` sessions (:meth:`new_cache`). :meth:`step` takes token
    ids (``embed``) or a hidden state and returns the hidden state it forwards or, with
    ``head``, the last position's logits; :meth:`step_batch` runs several sessions' decode
    steps as one."""

    def __init__(self, model: GGUFModel, first: int, end: int, *, embed: bool, head: bool,
                 max_context: int, threads: int = 1, activations: str = "float",
                 sessions: int = 1) -> None:
        self.shape: GGUFShape = model.shape
        s = self.shape
        if not 0 <= first <= end <= s.num_layers:
            raise ConfigError(f"layers [{first}, {end}) are not in the model's "
                              f"{s.num_layers}")
        if not 1 <= max_context <= s.max_positions:
            raise ConfigError(f"max context {max_context} is not within the model's "
                              f"{s.max_positions} positions")
        self.first, self.end, self.max_context = first, end, max_context
        if activations not in ACTIVATIONS:
            raise ConfigError(f"activations {activations!r}: choose one of "
                              f"{', '.join(ACTIVATIONS)}")
        self.activations = activations
        self.embed = _embedding(model) if embed else None
        self.has_head = head
        self.kinds: dict[str, int] = {}  # tensor type -> tensors of it the stage holds
        self.weight_bytes = 0
        with tempfile.TemporaryDirectory(prefix="edgesplit-stage-") as folder:
            path = Path(folder) / "stage.onnx"
            with open(path.with_name(_WEIGHTS), "wb") as weights:
                graph = self._graph(model, _Graph(weights, _WEIGHTS))
            self._session = self._open(graph, path, threads)
        del graph
        _trim_heap()
        self._out = self._session.get_outputs()[-1].name
        self.pool = KVPool(end - first, s.num_kv_heads, max_context + 1, s.head_dim,
                           capacity=sessions) if end > first else None
        self._bound: dict[tuple[int, int], _Rows] = {}  # per row span, its binding

    # ---- building --------------------------------------------------------------------------
    def _graph(self, model: GGUFModel, g: _Graph) -> Any:
        """The stage's ONNX model, its large initializers written to ``g``'s weights file."""
        from onnx import TensorProto, helper

        s = self.shape
        g.inputs.append(helper.make_tensor_value_info("hidden", TensorProto.FLOAT,
                                                      ["B", "T", s.hidden_size]))
        if self.end > self.first:
            g.inputs += [helper.make_tensor_value_info("seqlens_k", TensorProto.INT32, ["B"]),
                         helper.make_tensor_value_info("total_len", TensorProto.INT32, [1])]
            cos, sin = _rotary(s, self.max_context + 1)  # a row's throw-away position too
            g.const("cos", cos)
            g.const("sin", sin)
        x = "hidden"
        for i in range(self.first, self.end):
            x = self._layer(g, model, i, x)
        if self.has_head:
            self._head(g, model, x)
        else:
            if x == "hidden":  # an empty stage passes the state on
                x = g.node("Identity", ["hidden"], ["out"])[0]
            g.outputs.append(helper.make_tensor_value_info(x, TensorProto.FLOAT, None))
        graph = helper.make_graph(g.nodes, "stage", g.inputs, g.outputs, g.initializers)
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                       helper.make_opsetid(_MS, 1)])

    def _norm(self, g: _Graph, name: str, x: str, weight: np.ndarray) -> str:
        """RMSNorm of ``x`` with ``weight``."""
        gamma = g.const(f"{name}.w", weight.reshape(-1).astype(np.float32))
        return g.node("SimplifiedLayerNormalization", [x, gamma], [f"{name}.y"], axis=-1,
                      epsilon=self.shape.rms_eps)[0]

    def _linear(self, g: _Graph, name: str, kind: str, x: str,
                tensors: list[QuantTensor]) -> list[str]:
        """``x`` times each of ``tensors`` ([out, in]): one fused product, split after."""
        y = self._sum(g, f"{name}.y", self._product(g, name, kind, x, tensors))
        if len(tensors) == 1:
            return [y]
        sizes = g.const(f"{name}.split", np.array([t.rows for t in tensors], np.int64))
        return g.node("Split", [y, sizes], [f"{name}.{i}" for i in range(len(tensors))],
                      axis=-1)

    @staticmethod
    def _sum(g: _Graph, name: str, terms: list[str]) -> str:
        return terms[0] if len(terms) == 1 else g.node("Sum", terms, [name])[0]

    def _product(self, g: _Graph, name: str, kind: str, x: str,
                 tensors: list[QuantTensor]) -> list[str]:
        """The terms whose sum is ``x`` times ``tensors`` stacked along N: one MatMulNBits
        where they share a kernel type (and, for Q4_1, its minimums' term), else a float32
        MatMul. The caller adds them where it adds anyway (a residual): one node fewer, and
        at ~4 us a node ONNX Runtime's dispatch is a fifth of a decode step (measured)."""
        for t in tensors:
            self.kinds[t.kind] = self.kinds.get(t.kind, 0) + 1
        kinds = {t.kind for t in tensors}
        if len(kinds) == 1 and kinds <= set(KERNEL_TYPES):
            weight = _fused([nbits_weight(t) for t in tensors])
            level = ACTIVATIONS[self.activations][weight.bits][kind]
            return self._matmul_nbits(g, name, x, weight, level)
        w32 = np.concatenate([_float_logged(t) for t in tensors], axis=0)
        self.weight_bytes += w32.nbytes
        dense = g.const(f"{name}.w", w32.T.copy(), prepacked=True)
        return g.node("MatMul", [x, dense], [f"{name}.f"])

    def _matmul_nbits(self, g: _Graph, name: str, x: str, w: NBitsWeight,
                      level: int) -> list[str]:
        self.weight_bytes += w.nbytes
        ins = [x, g.const(f"{name}.b", w.packed, prepacked=True), g.const(f"{name}.s", w.scales)]
        y = g.node("MatMulNBits", ins, [f"{name}.q"], domain=_MS, K=w.k, N=w.n,
                   bits=w.bits, block_size=BLOCK, accuracy_level=level)[0]
        if w.mins is None:
            return [y]
        # Q4_1's offsets: x's block sums (one per input, shared by a fused weight's parts)
        # times m + 8 d, a float matmul K / 32 wide (stage/quantized.py says why)
        mins = g.const(f"{name}.m", np.ascontiguousarray(w.mins.T), prepacked=True)
        return [y, g.node("MatMul", [self._block_sums(g, x, w.k), mins], [f"{name}.mx"])[0]]

    @staticmethod
    def _block_sums(g: _Graph, x: str, k: int) -> str:
        """``x`` ([B, T, K]) summed over each block of 32, [B, T, K / 32], as one MatMul by
        a 0/1 block indicator (one node, not a reshape and a reduction); once per x."""
        name = f"{x}.blocksum"
        if name not in g.made:
            g.made.add(name)
            indicator = f"blocks.{k}"
            if indicator not in g.made:
                g.made.add(indicator)
                g.const(indicator, np.kron(np.eye(k // BLOCK, dtype=np.float32),
                                           np.ones((BLOCK, 1), np.float32)), prepacked=True)
            g.node("MatMul", [x, indicator], [name])
        return name

    def _layer(self, g: _Graph, model: GGUFModel, i: int, x: str) -> str:
        from onnx import TensorProto, helper

        s, n = self.shape, f"l{i}"
        a = self._norm(g, f"{n}.attn_norm", x, float_weight(model.linear("attn_norm", i)))
        # one product for Q, K and V, packed as GroupQueryAttention takes it (no split)
        qkv = self._sum(g, f"{n}.qkv.y", self._product(g, f"{n}.qkv", "qkv", a,
                                                       [model.linear(p, i) for p in "qkv"]))
        cache: list[str | int] = ["B", s.num_kv_heads, self.max_context + 1, s.head_dim]
        g.inputs += [helper.make_tensor_value_info(f"{n}.past_k", TensorProto.FLOAT, cache),
                     helper.make_tensor_value_info(f"{n}.past_v", TensorProto.FLOAT, cache)]
        attn, pk, pv = g.node(
            "GroupQueryAttention", [qkv, "", "", f"{n}.past_k", f"{n}.past_v", "seqlens_k",
                                    "total_len", "cos", "sin"],
            [f"{n}.attn", f"{n}.present_k", f"{n}.present_v"], domain=_MS,
            num_heads=s.num_heads, kv_num_heads=s.num_kv_heads, do_rotary=1,
            rotary_interleaved=0, scale=float(s.head_dim ** -0.5))
        g.outputs += [helper.make_tensor_value_info(y, TensorProto.FLOAT, cache)
                      for y in (pk, pv)]
        x = g.node("Sum", [x, *self._product(g, f"{n}.o", "o", attn, [model.linear("o", i)])],
                   [f"{n}.mid"])[0]
        f = self._norm(g, f"{n}.ffn_norm", x, float_weight(model.linear("ffn_norm", i)))
        gate, up = self._linear(g, f"{n}.gate_up", "gate_up", f, [model.linear("gate", i),
                                                      model.linear("up", i)])
        silu = g.node("QuickGelu", [gate], [f"{n}.silu"], domain=_MS, alpha=1.0)[0]  # x*sig(x)
        act = g.node("Mul", [silu, up], [f"{n}.act"])[0]
        return g.node("Sum", [x, *self._product(g, f"{n}.down", "down", act,
                                                [model.linear("down", i)])], [f"{n}.out"])[0]

    def _head(self, g: _Graph, model: GGUFModel, x: str) -> None:
        from onnx import TensorProto, helper

        last = g.node("Slice", [x, g.const("last.from", np.array([-1], np.int64)),
                                g.const("last.to", np.array([2**31], np.int64)),
                                g.const("last.axis", np.array([1], np.int64))],
                      ["last.x"])[0]
        normed = self._norm(g, "output_norm", last,
                            float_weight(model.tensor("output_norm.weight")))
        (logits,) = self._linear(g, "head", "head", normed, [model.head()])
        g.outputs.append(helper.make_tensor_value_info(logits, TensorProto.FLOAT, None))

    @staticmethod
    def _open(model: Any, path: Path, threads: int) -> Any:
        """A session of ``model`` saved at ``path``, beside its weights file: ONNX Runtime
        reads the weights from the file, where handing it serialized bytes holds another copy
        until the session is built. The folder may go once the session is open."""
        import onnx
        import onnxruntime as ort

        onnx.save_model(model, str(path))
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        # a decode step is a few milliseconds: spinning workers would take the core another
        # stage or process on this device needs between steps
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])

    # ---- running ---------------------------------------------------------------------------
    def new_cache(self) -> KVSlot | None:
        """An empty KV cache for one session: a row of the stage's pool (None: the stage has
        no layers); SessionsBusyError when all ``sessions`` rows are in use."""
        return None if self.pool is None else self.pool.take()

    def cache_bytes(self) -> int:
        """Bytes of one session's KV cache at the max context."""
        s = self.shape
        return 2 * (self.end - self.first) * s.num_kv_heads * self.max_context * s.head_dim * 4

    def step(self, x: np.ndarray, position: int, cache: KVSlot | None) -> np.ndarray:
        """Run positions ``position .. position + T - 1`` (``x``: token ids ``[1, T]`` where
        the stage embeds, else a hidden state ``[1, T, H]``); the hidden state ``[1, T, H]``
        it forwards, or with the head the last position's logits ``[1, vocab]``. The cache
        holds ``position + T`` tokens after."""
        hidden = self._hidden([x])
        total = position + int(hidden.shape[1])
        self._check_fits(total)
        if cache is None:  # no layers: nothing cached
            return self._finish(self._run(self._session.io_binding(), hidden), 1)
        rows = self._rows(cache.row, cache.row + 1)
        rows.seqlens[0], rows.total[0] = total - 1, total
        out = self._run(rows.binding, hidden)
        cache.length = total
        return self._finish(out, 1)

    def step_batch(self, steps: list[RowStep]) -> list[np.ndarray]:
        """Decode steps (one token each) of sessions on distinct rows, as one run over the
        rows they span: each its :meth:`step`'s result. A row in the span that takes no part
        computes a throw-away token at its own length (the module docstring says why that
        is harmless)."""
        if len(steps) == 1:
            one = steps[0]
            return [self.step(one.x, one.position, one.cache)]
        assert self.pool is not None
        slots = [st.cache for st in steps]
        if any(st.x.shape[1] != 1 for st in steps) or len({c.row for c in slots}) != len(slots):
            raise ConfigError("a batch holds one token of each of distinct sessions")
        for st in steps:
            self._check_fits(st.position + 1)
        lo, hi = min(c.row for c in slots), max(c.row for c in slots) + 1
        at = {c.row - lo: i for i, c in enumerate(slots)}
        hidden = np.zeros((hi - lo, 1, self.shape.hidden_size), np.float32)
        hidden[list(at)] = self._hidden([st.x for st in steps])
        rows = self._rows(lo, hi)
        # a row's past: its session's position, or what an idle row holds (a free one: 0)
        rows.seqlens[:] = np.minimum(self.pool.lengths[lo:hi], self.max_context)
        for r, i in at.items():
            rows.seqlens[r] = steps[i].position
        rows.total[0] = int(rows.seqlens.max()) + 1
        out = self._finish(self._run(rows.binding, hidden), hi - lo)
        for st in steps:
            st.cache.length = st.position + 1
        return [out[r:r + 1] for r in at]

    def _check_fits(self, total: int) -> None:
        if total > self.max_context:
            raise ConfigError(f"positions up to {total} pass the stage's max context of "
                              f"{self.max_context}")

    def _hidden(self, xs: list[np.ndarray]) -> np.ndarray:
        """The hidden state ``[len(xs), T, H]`` of token ids (embedded) or hidden states."""
        if self.embed is not None:
            ids = np.concatenate([np.asarray(x, np.int64).reshape(1, -1) for x in xs])
            return self._embed(ids.reshape(-1)).reshape(len(xs), ids.shape[1], -1)
        if len(xs) == 1:
            return np.ascontiguousarray(xs[0], dtype=np.float32)
        return np.concatenate([np.asarray(x, np.float32) for x in xs])

    def _run(self, binding: Any, hidden: np.ndarray) -> np.ndarray:
        binding.bind_cpu_input("hidden", hidden)
        rows, tokens = hidden.shape[:2]
        if self.has_head:
            out = np.empty((rows, 1, self.shape.vocab_size), np.float32)
        else:
            out = np.empty((rows, tokens, self.shape.hidden_size), np.float32)
        binding.bind_ortvalue_output(self._out, _ort().OrtValue.ortvalue_from_numpy(out))
        self._session.run_with_iobinding(binding)
        return out

    def _finish(self, out: np.ndarray, rows: int) -> np.ndarray:
        """Logits ``[rows, vocab]`` with the head, else the hidden state as computed."""
        return out.reshape(rows, -1) if self.has_head else out

    def _rows(self, lo: int, hi: int) -> _Rows:
        """The binding of pool rows ``lo .. hi - 1`` (made at first use, then kept: the cache
        views stay bound, a step rebinds only its hidden state and output and writes its
        lengths in place, 120 binding calls a step fewer for 30 layers)."""
        bound = self._bound.get((lo, hi))
        if bound is not None:
            return bound
        assert self.pool is not None
        ort = _ort()
        binding = self._session.io_binding()
        seqlens, total = np.zeros(hi - lo, np.int32), np.zeros(1, np.int32)
        binding.bind_ortvalue_input("seqlens_k", ort.OrtValue.ortvalue_from_numpy(seqlens))
        binding.bind_ortvalue_input("total_len", ort.OrtValue.ortvalue_from_numpy(total))
        keys, values = self.pool.rows(lo, hi)
        for j, i in enumerate(range(self.first, self.end)):
            k = ort.OrtValue.ortvalue_from_numpy(keys[j])  # shares the pool's memory
            v = ort.OrtValue.ortvalue_from_numpy(values[j])
            binding.bind_ortvalue_input(f"l{i}.past_k", k)
            binding.bind_ortvalue_input(f"l{i}.past_v", v)
            binding.bind_ortvalue_output(f"l{i}.present_k", k)
            binding.bind_ortvalue_output(f"l{i}.present_v", v)
        bound = self._bound[(lo, hi)] = _Rows(binding, seqlens, total, keys + values)
        return bound

    def _embed(self, ids: np.ndarray) -> np.ndarray:
        rows = np.asarray(ids, np.int64).reshape(-1)
        if rows.size and (rows.min() < 0 or rows.max() >= self.shape.vocab_size):
            raise ConfigError(f"token ids must be in [0, {self.shape.vocab_size})")
        assert self.embed is not None
        return self.embed.dequantize_rows(rows)[None]


@dataclass
class RowStep:
    """One session's decode step in a batch: its token id or hidden state ``x`` (``[1, 1]``
    or ``[1, 1, H]``), the position it continues from, and its cache row."""

    x: np.ndarray
    position: int
    cache: KVSlot


@dataclass
class _Rows:
    """A binding of pool rows: the lengths it reads, written in place before each run, and
    the views it binds (kept alive with it)."""

    binding: Any
    seqlens: np.ndarray
    total: np.ndarray
    views: list[np.ndarray]


def _trim_heap() -> None:
    """Hand the heap's free pages back to the system (glibc's ``malloc_trim``; elsewhere
    nothing): building leaves 20-35 MiB of freed repacking buffers and protobuf resident
    in the heap's middle, where free() alone does not return them (measured on SmolLM2)."""
    with contextlib.suppress(AttributeError, OSError):  # not glibc
        ctypes.CDLL(None).malloc_trim(0)


def _ort() -> Any:
    import onnxruntime

    return onnxruntime


def _rotary(s: GGUFShape, positions: int) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin ``[positions, head_dim / 2]``, as transformers' default Llama rotary
    embedding computes them (float32, inverse frequencies from ``rope_theta``)."""
    inv = 1.0 / (s.rope_theta ** (np.arange(0, s.head_dim, 2, dtype=np.int64)
                                  .astype(np.float32) / s.head_dim))
    freqs = np.outer(np.arange(positions, dtype=np.float32), inv.astype(np.float32))
    return np.cos(freqs).astype(np.float32), np.sin(freqs).astype(np.float32)


def _fused(weights: list[NBitsWeight]) -> NBitsWeight:
    """Weights of one type and input size stacked along N: one kernel call."""
    if len(weights) == 1:
        return weights[0]
    first = weights[0]
    mins = None if first.mins is None else np.concatenate([w.mins for w in weights
                                                           if w.mins is not None])
    return NBitsWeight(sum(w.n for w in weights), first.k, first.bits,
                       np.concatenate([w.packed for w in weights]),
                       np.concatenate([w.scales for w in weights]), first.zero, mins)


_SAID: set[str] = set()


def _float_logged(t: QuantTensor) -> np.ndarray:
    """A weight without a kernel, dequantised to float32, said once per type."""
    if t.kind not in ("F32", "F16", "BF16") and t.kind not in _SAID:
        _SAID.add(t.kind)
        log.warning("GGUF type %s has no quantized kernel here (%s do): its tensors run "
                    "dequantised to float32", t.kind, ", ".join(KERNEL_TYPES))
    return float_weight(t)


def _embedding(model: GGUFModel) -> QuantTensor:
    """The token embedding as stored, mapped: a lookup dequantises its rows from the file's own
    pages (a tied head's MatMulNBits initializer is the stage's one repacked copy). Row 0 is
    read now, so a type gguf cannot dequantise fails as the stage loads, not at its first
    step."""
    t = model.mapped("token_embd.weight")
    t.dequantize_rows(np.zeros(1, np.int64))
    return t

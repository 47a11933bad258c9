"""Capture a model into a LayerGraph with ``torch.export``.

Accepted models: an ``nn.Module`` with example inputs, an ``ExportedProgram``, a path to a
program saved with ``torch.export.save`` (``.pt2``), the name of a built-in model, or a model
in the user's code (``my_net.py:MyNet``, ``package.module:make_model``; see
:mod:`edgesplit.graph.user_model`).

Pipeline: export -> functionalise (``run_decompositions({})`` keeps high-level ops such as
``conv2d``/``linear`` but turns in-place ops functional) -> unlift parameters -> strip run-time
checks -> fold input-independent constants -> [optimised: fold batch-norm] -> take out the
split-point markers (:mod:`edgesplit.graph.markers`) -> group into layers.
"""

from __future__ import annotations

import io
import logging
import re
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.export import ExportedProgram

from edgesplit.errors import CaptureError, ConfigError, option
from edgesplit.graph.fusion import build_layer_graph
from edgesplit.graph.ir import LayerGraph
from edgesplit.graph.markers import strip_split_points
from edgesplit.graph.model_file import (
    ModelFileLimits,
    TrustedModelFile,
    read_model_file,
    register_spec_types,
    unsafe_payloads,
)
from edgesplit.graph.passes import fold_batchnorm, fold_constants, strip_checks
from edgesplit.graph.saved_shape import fits_input_shape, is_dynamic, shape_option
from edgesplit.graph.user_model import is_code_ref, load_user_model

__all__ = [
    "Exported",
    "TrustedModelFile",
    "capture",
    "check_input_shape",
    "export_for_capture",
    "export_model",
    "is_model_file",
    "load_program",
    "optimize_program",
    "parse_shape",
]

log = logging.getLogger(__name__)




def parse_shape(text: str) -> tuple[int, ...]:
    """``"1,3,224,224"`` -> ``(1, 3, 224, 224)``, with a clear error for anything else."""
    try:
        shape = tuple(int(part) for part in text.replace("x", ",").split(",") if part.strip())
    except ValueError:
        raise ConfigError(f"input shape {text!r} is not a comma-separated list of integers, "
                          "e.g. 1,3,224,224") from None
    if not shape or any(s <= 0 for s in shape):
        raise ConfigError(f"input shape {text!r} must list positive sizes, e.g. 1,3,224,224")
    return shape


def load_program(path: str | Path, *, trust_model_file: bool = False,
                 limits: ModelFileLimits | None = None) -> ExportedProgram:
    """Load a program saved with ``torch.export.save``; unreadable files raise CaptureError.

    A file larger than ``limits`` allow, or whose zip entries would inflate beyond them, is
    refused before it is read whole (see :class:`~edgesplit.graph.model_file.ModelFileLimits`;
    default: from the environment), as is a file that is not a torch.export archive.

    A file whose loading would unpickle data (tensor subclasses, custom objects, sample inputs
    that are not plain tensors, the pre-2.8 format) or load an AOTInductor library is refused
    unless ``trust_model_file`` (or ``path`` is a :class:`TrustedModelFile`): unpickling runs
    any code its author chose (see :mod:`edgesplit.graph.model_file`).
    """
    trusted = trust_model_file or isinstance(path, TrustedModelFile)
    path = Path(path)
    data = read_model_file(path, limits)
    unsafe = [] if trusted else unsafe_payloads(data)
    if unsafe:
        raise CaptureError(
            f"model file {str(path)!r} holds pickled data that loading would execute as code: "
            f"{'; '.join(unsafe[:3])}{' ...' if len(unsafe) > 3 else ''}. Load it only if you "
            f"trust who made it: pass {option('trust_model_file', True)}, or re-save it with "
            "torch.export.save from a model with plain tensor weights")
    register_spec_types(data, str(path), trusted=trusted)
    # torch logs a traceback before re-raising for archives it cannot parse; our error says it.
    torch_log = logging.getLogger("torch.export")
    level = torch_log.level
    torch_log.setLevel(logging.CRITICAL)
    try:
        return torch.export.load(io.BytesIO(data))
    except Exception as exc:  # torch raises many types for corrupt archives
        raise CaptureError(f"cannot read {str(path)!r} as a torch.export program: "
                           f"{_first_line(exc)}") from exc
    finally:
        torch_log.setLevel(level)


def _first_line(exc: BaseException) -> str:
    """The exception's type and first non-empty line (torch's messages run to pages)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    text = lines[0] if lines else ""
    if len(text) > 300:
        text = text[:297] + "..."
    return f"{type(exc).__name__}: {text}".strip()


# torch.export names the user's statement that failed at the end of its message
_RAISED_AT = re.compile(r'The following call raised this error:\s*\n\s*File "([^"]+)", line '
                        r'(\d+), in (\S+)\n\s*(\S.*)')


def _user_code(exc: BaseException) -> str:
    """`` at FILE:LINE in FUNC: STATEMENT``: where in the user's code torch.export failed, as
    torch names it (its first line names torch's own internals), or nothing."""
    found = _RAISED_AT.search(str(exc))
    if found is None:
        return ""
    path, line, func, code = found.groups()
    return f" at {path}:{line} in {func}: {code.strip()}"


def _hint(exc: BaseException) -> str:
    """What to change for the failures users meet most: branching on a tensor's value."""
    text = f"{type(exc).__name__} {exc}"
    if "DataDependent" in text or "data-dependent" in text:
        return (" (the model branches on a tensor's value, which one graph cannot hold: "
                "write the branch as torch.cond(pred, true_fn, false_fn, operands), or compute "
                "both sides and pick with torch.where)")
    return ""


def _as_tuple(example_inputs: Any) -> tuple[torch.Tensor, ...]:
    if isinstance(example_inputs, torch.Tensor):
        return (example_inputs,)
    if isinstance(example_inputs, (list, tuple)) and example_inputs:
        return tuple(example_inputs)
    raise CaptureError("capturing an nn.Module needs example inputs: a tensor or a tuple of "
                       "tensors with the shape the model will run at")


def export_model(module: torch.nn.Module, example_inputs: Any, *, name: str = "model"
                 ) -> ExportedProgram:
    """``torch.export.export`` in eval mode, turning failures into CaptureError."""
    args = _as_tuple(example_inputs)
    shapes = ", ".join(str(tuple(a.shape)) for a in args if isinstance(a, torch.Tensor))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return torch.export.export(module.eval(), args, strict=False)
    except Exception as exc:
        raise CaptureError(f"torch.export could not capture {name} with input shape(s) {shapes}: "
                           f"{_first_line(exc)}{_user_code(exc)}{_hint(exc)}") from exc


def saved_input_shape(path: str | Path, *, trust_model_file: bool = False) -> tuple[int, ...]:
    """The shape of the (first) input a ``.pt2`` was exported with."""
    example = _example_inputs_of(load_program(path, trust_model_file=trust_model_file))
    if not example:
        raise ConfigError(f"model file {str(path)!r} takes no input")
    return tuple(int(d) for d in example[0].shape)


def _example_inputs_of(ep: ExportedProgram) -> tuple[torch.Tensor, ...]:
    stored = getattr(ep, "example_inputs", None)
    if stored is not None and stored[0]:
        return tuple(stored[0])
    inputs = []
    for spec in ep.graph_signature.input_specs:
        if spec.kind.name == "USER_INPUT":
            node = next(n for n in ep.graph.nodes if n.name == spec.arg.name)
            val = node.meta["val"]
            inputs.append(torch.zeros(val.shape, dtype=val.dtype))
    return tuple(inputs)


def _is_functional(ep: ExportedProgram) -> bool:
    """True when no operator of the program mutates its inputs (export's default IR keeps
    in-place ops such as ``add_``; the analyses and partitioning need a functional graph)."""
    for node in ep.graph.nodes:
        schema = getattr(node.target, "_schema", None)
        if node.op == "call_function" and schema is not None and schema.is_mutable:
            return False
    return True


def optimize_program(ep: ExportedProgram, *, optimize: bool = True, name: str = "the model"
                     ) -> torch.fx.GraphModule:
    """The runnable, functional, unlifted program that the LayerGraph maps onto."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        gm = _unlift(ep, name)
    for param in gm.parameters():
        param.requires_grad_(False)
    strip_checks(gm)
    fold_constants(gm)
    if optimize:
        fold_batchnorm(gm)
    strip_split_points(gm)  # after the passes, so they keep each marked value
    return gm


def _unlift(ep: ExportedProgram, name: str) -> torch.fx.GraphModule:
    """Functionalise when needed, then ``ep.module()``; torch's failures become CaptureError."""
    _check_attribute_names(ep, name)
    try:
        if not _is_functional(ep):  # functionalising costs ~10 ms per node: only when needed
            log.debug("functionalising in-place operators")
            ep = ep.run_decompositions({})
        return ep.module()
    except Exception as exc:
        raise CaptureError(f"torch.export captured {name} but could not make it a runnable "
                           f"module: {_first_line(exc)}") from exc


def _graph_module_attributes() -> frozenset[str]:
    return frozenset(dir(torch.fx.GraphModule(torch.nn.Module(), torch.fx.Graph())))


def _check_attribute_names(ep: ExportedProgram, name: str) -> None:
    """``ep.module()`` hangs weights on a torch.fx.GraphModule by their module path; a top-level
    submodule named like one of its own attributes (``meta``, ``graph``, ``code``...) resolves
    to that attribute instead, and torch fails with "references nonexistent attribute"."""
    reserved = _graph_module_attributes()
    for spec in ep.graph_signature.input_specs:
        top = str(spec.target or "").split(".")[0]
        if top and top in reserved:
            raise CaptureError(
                f"{name} has a submodule or attribute named {top!r} (holding {spec.target!r}), "
                f"which torch.export's unlifted module reserves (GraphModule.{top}): rename "
                f"that attribute in the model (e.g. self.{top}_ = ...) and capture it again")


@dataclass(frozen=True)
class Exported:
    """A model exported once, ready to capture as several graphs (raw and optimised): what
    :func:`export_for_capture` returns and :func:`capture` accepts in place of the model, so
    that a planner comparing both graphs pays torch.export once."""

    program: ExportedProgram
    name: str
    example: tuple[torch.Tensor, ...]
    strip_prefix: str = ""


def export_for_capture(
    model: Any,
    example_inputs: Any = None,
    *,
    input_shape: Sequence[int] | None = None,
    name: str | None = None,
    trust_model_file: bool = False,
) -> Exported:
    """``model`` (anything :func:`capture` takes) exported, before any graph pass (the passes
    build new modules and never change the program, so one export serves every graph)."""
    if isinstance(model, Exported):
        return model
    strip = ""
    if isinstance(model, (str, Path)) and is_model_file(model):
        ep = load_program(model, trust_model_file=trust_model_file)
        name = name or Path(model).stem
        example = _example_inputs_of(ep)
        if input_shape is not None:
            ep, example = _at_shape(ep, example, tuple(input_shape), str(model))
        elif len(example) == 1 and is_dynamic(ep):
            # specialised at its example's shape: size reads of a dynamic dimension would be
            # layers of their own, which the same program at another batch does not have
            ep, example = _at_shape(ep, example, tuple(example[0].shape), str(model))
    elif is_code_ref(model):
        module, example = load_user_model(model, input_shape)
        name = name or model.rpartition(":")[2]
        ep = export_model(module, example, name=name)
    elif isinstance(model, str):
        from edgesplit.models import create_model

        built = create_model(model, input_shape)
        name = name or model
        strip = getattr(built.module, "edgesplit_strip_prefix", "")
        example = built.example_inputs
        ep = export_model(built.module, example, name=name)
    elif isinstance(model, ExportedProgram):
        ep, name = model, name or "program"
        example = (_as_tuple(example_inputs) if example_inputs is not None
                   else _example_inputs_of(ep))
    elif isinstance(model, torch.nn.Module):
        name = name or type(model).__name__
        example = _as_tuple(example_inputs)
        strip = getattr(model, "edgesplit_strip_prefix", "")
        ep = export_model(model, example, name=name)
    else:
        raise CaptureError(f"cannot capture an object of type {type(model).__name__}: pass an "
                           "nn.Module with example inputs, an ExportedProgram, a .pt2 path or a "
                           "built-in model name")
    return Exported(ep, name, example, strip)


def capture(
    model: Any,
    example_inputs: Any = None,
    *,
    input_shape: Sequence[int] | None = None,
    optimize: bool = True,
    name: str | None = None,
    trust_model_file: bool = False,
) -> LayerGraph:
    """Capture ``model`` into a :class:`LayerGraph`.

    ``model`` is an nn.Module with ``example_inputs``, an ExportedProgram, a ``.pt2`` path, a
    built-in model name, a model in the user's code (``my_net.py:MyNet``: a class built with no
    arguments or a factory, run on a float input of ``input_shape``, which it needs), or an
    :class:`Exported` (to capture one export several ways).
    ``optimize=True`` gives the graph an inference engine runs (batch-norm folded, element-wise
    operators fused: what QDMP and AUTO-SPLIT plan on); ``optimize=False`` keeps one layer per
    operator (the raw graph DADS plans on). ``input_shape`` applies to built-in models, and to a
    ``.pt2`` file when it is the shape the file was exported at or one its dynamic dimensions
    allow (the program is then exported again at that shape); any other shape is a
    ConfigError naming the file's (see :func:`check_input_shape`).
    ``trust_model_file`` lets a ``.pt2`` file run the pickled code it may hold (see
    :func:`load_program`).
    """
    exported = export_for_capture(model, example_inputs, input_shape=input_shape, name=name,
                                  trust_model_file=trust_model_file)
    gm = optimize_program(exported.program, optimize=optimize, name=exported.name)
    return build_layer_graph(gm, model=exported.name, optimize=optimize,
                             example_inputs=exported.example, strip_prefix=exported.strip_prefix)


def check_input_shape(model: Any, input_shape: Sequence[int] | None, *,
                      trust_model_file: bool = False) -> None:
    """Refuse, before any other work, an ``input_shape`` that a saved program cannot take.

    Nothing to check unless ``model`` is a model file and ``input_shape`` is given; then the
    program is loaded and ConfigError says what shape it was exported for, as :func:`capture`
    would (which checks the same itself; this is for callers with work to do first)."""
    if input_shape is None or not (isinstance(model, (str, Path)) and is_model_file(model)):
        return
    ep = load_program(model, trust_model_file=trust_model_file)
    fits_input_shape(ep, _example_inputs_of(ep), tuple(input_shape), str(model))


def _at_shape(ep: ExportedProgram, example: tuple[torch.Tensor, ...], shape: tuple[int, ...],
              path: str) -> tuple[ExportedProgram, tuple[torch.Tensor, ...]]:
    """``ep`` and its example at ``shape``: itself where it was exported at that shape, else
    exported again from its own module at ``shape``, which its dynamic dimensions allow (a
    dynamic program is always exported again: specialised, its graph is the same at any size)."""
    if fits_input_shape(ep, example, shape, path) and not is_dynamic(ep):
        return ep, example
    dtype = next(iter(example)).dtype if example else torch.float32
    inputs = (torch.zeros(shape, dtype=dtype),)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return torch.export.export(ep.module(), inputs, strict=False), inputs
    except Exception as exc:  # the program's own guards (e.g. a size it must divide)
        raise ConfigError(f"model file {path!r} cannot run at {shape_option(shape)}: "
                          f"{_first_line(exc)}; re-export the model at that shape and save it "
                          "again") from exc


# suffixes of model files people try: a missing one is "does not exist", not "unknown model"
_MODEL_FILE_SUFFIXES = (".pt2", ".pt", ".pth", ".onnx", ".safetensors", ".bin", ".ckpt",
                        ".tflite", ".h5", ".pb", ".zip")


def is_model_file(model: str | Path) -> bool:
    """Whether ``model`` names a file (to load as a saved program) rather than a built-in
    model: a Path, a name with a model file's suffix or a folder, or an existing file."""
    text = str(model)
    if is_code_ref(model):  # my_net.py:MyNet names code, even in a folder (nets/my_net.py)
        return False
    return isinstance(model, Path) or text.lower().endswith(_MODEL_FILE_SUFFIXES) \
        or "/" in text or Path(text).is_file()

"""Which input shapes a saved program (``.pt2``) can take.

``torch.export`` specialises a program to the shapes it was exported with, except for the
dimensions exported as dynamic (``torch.export.Dim``), which may take any size in their range.
:func:`fits_input_shape` says whether a shape a user asks for (``--input-shape``) is the exported
one, one the dynamic dimensions allow, or neither (a one-line ConfigError naming the shape the
file fixes and how to get another).
"""

from __future__ import annotations

from typing import Any

import torch
from torch.export import ExportedProgram

from edgesplit.errors import ConfigError, option

__all__ = ["fits_input_shape", "is_dynamic", "shape_option"]


class _Shape(tuple):
    """A shape that reads ``(2, 4)`` in Python (repr) and ``2,4`` on the command line (str)."""

    def __str__(self) -> str:
        return ",".join(map(str, self))


def shape_option(shape: tuple[int, ...]) -> str:
    """``input_shape=(2, 4)``, or ``--input-shape 2,4`` under the CLI."""
    return option("input_shape", _Shape(shape))


def _dims(ep: ExportedProgram) -> list[tuple[Any, ...]]:
    """Each user input's dimensions as exported: ints, and sympy expressions where the
    program was exported with dynamic shapes."""
    found = []
    for spec in ep.graph_signature.input_specs:
        if spec.kind.name == "USER_INPUT":
            node = next(n for n in ep.graph.nodes if n.name == spec.arg.name)
            val = node.meta.get("val")
            shape = getattr(val, "shape", ())
            found.append(tuple(d.node.expr if isinstance(d, torch.SymInt) else int(d)
                               for d in shape))
    return found


def _range(ep: ExportedProgram, expr: Any) -> tuple[int, int | None]:
    """The sizes a dynamic dimension may take (upper None: no bound)."""
    from torch.utils._sympy.numbers import int_oo

    bounds = ep.range_constraints.get(expr)
    if bounds is None:
        return 0, None
    upper = None if bounds.upper in (int_oo, -int_oo) else int(bounds.upper)
    return int(bounds.lower), upper


def _describe(ep: ExportedProgram, dims: tuple[Any, ...]) -> str:
    """``1,3,224,224``; a dynamic dimension as ``1..64`` (or ``2..``)."""
    parts = []
    for d in dims:
        if isinstance(d, int):
            parts.append(str(d))
        elif getattr(d, "is_Symbol", False):
            lower, upper = _range(ep, d)
            parts.append(f"{lower}..{'' if upper is None else upper}")
        else:
            parts.append(str(d))
    return ",".join(parts)


def _misfit(ep: ExportedProgram, dims: tuple[Any, ...], shape: tuple[int, ...]) -> str | None:
    """Why the program exported with ``dims`` cannot take ``shape``, or None."""
    if len(dims) != len(shape):
        return f"it has {len(dims)} dimensions, not {len(shape)}"
    given: dict[Any, int] = {}
    for i, (d, size) in enumerate(zip(dims, shape, strict=True)):
        if isinstance(d, int):
            if d != size:
                return f"dimension {i} is fixed to {d}"
        elif getattr(d, "is_Symbol", False):
            lower, upper = _range(ep, d)
            if size < lower or (upper is not None and size > upper):
                return f"dimension {i} takes {lower}..{'' if upper is None else upper}"
            if given.setdefault(d, size) != size:
                return f"dimension {i} must equal dimension {dims.index(d)}"
    for i, (d, size) in enumerate(zip(dims, shape, strict=True)):
        if not isinstance(d, int) and not getattr(d, "is_Symbol", False):
            value = d.subs(given)
            if not value.is_number or int(value) != size:
                return f"dimension {i} is {d}"
    return None


def is_dynamic(ep: ExportedProgram) -> bool:
    """Whether any input dimension of ``ep`` was exported dynamic."""
    return any(not isinstance(d, int) for dims in _dims(ep) for d in dims)


def fits_input_shape(ep: ExportedProgram, example: tuple[torch.Tensor, ...],
                     shape: tuple[int, ...], path: str) -> bool:
    """Whether ``shape`` is the shape ``ep`` was exported at (True) or one its dynamic
    dimensions allow (False); ConfigError, in one line, when it is neither."""
    dims = _dims(ep)
    fixed = "; ".join(_describe(ep, d) for d in dims)
    fix = (f"re-export the model at the shape you want (torch.export.export(model, "
           f"(torch.randn({', '.join(map(str, shape))}),)), or with dynamic_shapes for the "
           "dimensions that vary) and save it again")
    if len(dims) != 1:
        raise ConfigError(f"model file {path!r} takes {len(dims)} inputs, with the shapes it "
                          f"was exported for ({fixed}); {option('input_shape')} sets one "
                          f"input's shape: leave it out, or {fix}")
    if example and tuple(example[0].shape) == shape:
        return True
    why = _misfit(ep, dims[0], shape)
    if why is not None:
        raise ConfigError(f"model file {path!r} fixes its input shape to {fixed} (a .pt2 is "
                          f"specialised when exported): {shape_option(shape)} does not fit "
                          f"({why}); {fix}")
    return False

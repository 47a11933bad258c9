"""Models from the user's own code: ``my_net.py:MyNet`` or ``package.module:make_model``.

A new user's model lives in a Python file, not in edgesplit's zoo or a ``.pt2``. Such a
reference names a file (or a module importable from the current folder) and, after the colon,
an ``nn.Module`` class built with no arguments, a factory function returning one, or a module
instance. :func:`load_user_model` imports it, builds it and runs it once on an example of the
given shape, so that a constructor needing arguments or a forward that fails on the shape is
told apart from a failure of ``torch.export`` (which :func:`~.capture.capture` runs next).

Importing runs the file's code: that is what the user asks for by naming their own file.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from edgesplit.errors import CaptureError, option

__all__ = ["is_code_ref", "load_user_model", "resolve_code_ref"]

_DOTTED = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")
_HOWTO = ("name a class built with no arguments or a function returning an nn.Module, e.g. "
          "my_net.py:MyNet or my_net.py:make_model")


def is_code_ref(model: Any) -> bool:
    """Whether ``model`` names user code: ``FILE.py:NAME`` or ``package.module:NAME``."""
    if not isinstance(model, str) or model.count(":") != 1:
        return False
    where, name = model.split(":")
    return bool(_DOTTED.fullmatch(name)) and (where.endswith(".py")
                                               or bool(_DOTTED.fullmatch(where)))


def resolve_code_ref(ref: str) -> str:
    """``ref`` with its file made absolute, so it names the same code from any folder (a
    supernet or plan is used again from elsewhere); a module path is kept as it is."""
    where, name = ref.split(":")
    if not where.endswith(".py"):
        return ref
    return f"{Path(where).resolve()}:{name}"


def load_user_model(ref: str, input_shape: Sequence[int] | None
                    ) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    """The model ``ref`` names, in eval mode, and a float example input of ``input_shape``
    it was checked to run on; CaptureError saying what to change otherwise."""
    where, name = ref.split(":")
    module = _build(_attribute(_import(where), where, name), ref)
    if input_shape is None:
        raise CaptureError(f"{ref} is a model from your code, whose input shape edgesplit "
                           f"cannot know: give it with {option('input_shape', '1,3,224,224')} "
                           "(the shape of one batch its forward takes)")
    torch.manual_seed(0)  # the same example every time
    example = (torch.randn(tuple(input_shape)),)
    _check_forward(module, example, ref)
    return module, example


def _import(where: str) -> ModuleType:
    if where.endswith(".py"):
        return _import_file(Path(where))
    cwd = os.getcwd()
    if cwd not in sys.path:  # `package.module` is looked up from the current folder
        sys.path.insert(0, cwd)
    try:
        return importlib.import_module(where)
    except ModuleNotFoundError as exc:
        raise CaptureError(f"cannot import {where!r} ({exc}): run edgesplit from the folder "
                           "that holds it, or name its file instead (path/to/my_net.py:MyNet)"
                           ) from None
    except Exception as exc:
        raise CaptureError(f"importing {where!r} failed: {_first_line(exc)}; run `python -c "
                           f"'import {where}'` to see the traceback") from exc


def _import_file(path: Path) -> ModuleType:
    if not path.is_file():
        raise CaptureError(f"model file {str(path)!r} does not exist: give the path of the "
                           "Python file that defines your model, e.g. my_net.py:MyNet")
    path = path.resolve()
    # one module name per file, so two files called model.py do not replace each other
    digest = hashlib.sha256(str(path).encode()).hexdigest()[:12]
    name = f"edgesplit_user_{path.stem}_{digest}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise CaptureError(f"cannot import {str(path)!r} as Python code: {_HOWTO}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses and torch look classes up by their module
    if str(path.parent) not in sys.path:  # as `python my_net.py` would: siblings import
        sys.path.insert(0, str(path.parent))
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        del sys.modules[name]
        raise CaptureError(f"importing {str(path)!r} failed: {_first_line(exc)}; run `python "
                           f"{path}` to see the traceback") from exc
    return module


def _attribute(module: ModuleType, where: str, name: str) -> Any:
    found: Any = module
    for part in name.split("."):
        if not hasattr(found, part):
            choices = _candidates(module)
            listed = f"it defines {', '.join(choices)}" if choices else "it defines no nn.Module"
            raise CaptureError(f"{where} has no {name!r} ({listed}): {_HOWTO}")
        found = getattr(found, part)
    return found


def _candidates(module: ModuleType) -> list[str]:
    """Names in ``module`` a reference could mean: its nn.Module classes and functions."""
    own = getattr(module, "__name__", "")
    return [n for n, v in vars(module).items() if not n.startswith("_")
            and getattr(v, "__module__", None) == own
            and ((inspect.isclass(v) and issubclass(v, torch.nn.Module))
                 or inspect.isfunction(v))]


def _build(found: Any, ref: str) -> torch.nn.Module:
    if isinstance(found, torch.nn.Module):
        return found.eval()
    if not callable(found):
        raise CaptureError(f"{ref} is a {type(found).__name__}, not a model: {_HOWTO}")
    _check_no_arguments(found, ref)
    # seeded as built-ins are: weights the code does not load are the same in every process
    # that builds the model again (the edge and the cloud of a plan each do)
    torch.manual_seed(0)
    try:
        built = found()
    except Exception as exc:
        raise CaptureError(f"building {ref} failed: {_first_line(exc)}") from exc
    if not isinstance(built, torch.nn.Module):
        raise CaptureError(f"{ref}() returned a {type(built).__name__}, not a torch.nn.Module: "
                           f"{_HOWTO}")
    return built.eval()


def _check_no_arguments(found: Any, ref: str) -> None:
    """Refuse a class or factory whose call needs arguments, naming them: edgesplit has none to
    give, and calling it would fail with Python's less helpful TypeError."""
    try:
        signature = inspect.signature(found)
    except (TypeError, ValueError):
        return  # no signature to read (a builtin): the call says what is wrong
    needed = [p.name for p in signature.parameters.values() if p.default is p.empty
              and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    if needed:
        where, name = ref.split(":")
        raise CaptureError(f"{ref} needs arguments ({', '.join(needed)}) and edgesplit calls "
                           f"it with none: give them defaults, or add a function `def "
                           f"make_model(): return {name}(...)` to {where} and pass "
                           f"{where}:make_model")


def _check_forward(module: torch.nn.Module, example: tuple[torch.Tensor, ...], ref: str) -> None:
    shape = ",".join(str(s) for s in example[0].shape)
    try:
        with torch.no_grad():
            module(*example)
    except Exception as exc:
        raise CaptureError(f"{ref} fails on an input of shape {shape}: {_first_line(exc)}; "
                           f"give {option('input_shape')} the shape of one batch its forward "
                           "takes") from exc


def _first_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    text = lines[0] if lines else ""
    return f"{type(exc).__name__}: {text[:297] + '...' if len(text) > 300 else text}".strip()

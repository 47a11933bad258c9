"""Turn pydantic validation errors into one-line ConfigErrors that name the field and the fix."""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from edgesplit.errors import ConfigError

__all__ = ["build", "describe_validation_error"]

M = TypeVar("M", bound=BaseModel)


def describe_validation_error(exc: ValidationError, what: str) -> str:
    parts = []
    for error in exc.errors():
        field = ".".join(str(p) for p in error["loc"]) or "(top level)"
        got = error.get("input")
        got_text = "" if error["type"] == "missing" or isinstance(got, dict) else f" (got {got!r})"
        parts.append(f"field '{field}': {error['msg']}{got_text}")
    return f"invalid {what}: " + "; ".join(parts)


def build(model: type[M], data: Any, what: str) -> M:
    """``model.model_validate(data)`` with a ConfigError naming field, value and rule."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(describe_validation_error(exc, what)) from None

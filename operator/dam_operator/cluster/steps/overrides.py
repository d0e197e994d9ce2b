"""The spec's overrides of an engine declaration, as ``deploy/render.py`` writes them.

``diagnosis.observation.Thresholds`` and ``Hardware`` are the one declaration of what a
DAMProfile's ``spec.thresholds`` and ``spec.hardware`` hold: each field's type, bounds, default
and description. ``overrides`` reads a declaration into ``Override`` rows (with the spec's own
tighter bounds, ``limits``); ``model_lines`` writes a row as a field of the spec model
(``ThresholdsSpec``: every field optional, the same bounds, a float finite) and ``schema`` as
its property in the CRD's OpenAPI schema (the description states the engine's default). The
generated blocks of ``cluster/steps/spec.py`` and ``crds/damprofile.yaml`` are their output;
``deploy/render.py --check`` fails when either is stale. Pure: no I/O.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Mapping
from typing import Any, NamedTuple

from pydantic import BaseModel
from pydantic.fields import FieldInfo

BOUNDS = ("ge", "gt", "le", "lt", "min_length", "max_length")
"""The constraints a row carries, in the order the spec model and the CRD write them."""

LINE_LENGTH = 110  # ruff's line-length (pyproject.toml): a longer field is written as ruff formats it


class Override(NamedTuple):
    """One overridable field: its Python and wire names, its value's type, bounds, default, text."""

    name: str
    alias: str
    kind: type
    bounds: dict[str, float]
    default: float | int | str | None
    description: str


def _base(annotation: Any) -> type:
    """``float`` of ``Annotated[float, ...] | None``."""
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        (annotation,) = [a for a in typing.get_args(annotation) if a is not type(None)]
    if typing.get_origin(annotation) is typing.Annotated:
        annotation = typing.get_args(annotation)[0]
    if annotation not in (float, int, str):
        raise TypeError(f"no override for a field of type {annotation}")
    return typing.cast(type, annotation)


def _bounds(info: FieldInfo) -> dict[str, float]:
    """A field's constraints (``Ge`` …), also those inside ``Annotated[...] | None``."""
    metas: list[Any] = list(info.metadata)
    for arg in typing.get_args(info.annotation):
        metas.extend(getattr(arg, "__metadata__", ()))
    found: dict[str, float] = {}
    for meta in metas:
        for m in getattr(meta, "metadata", [meta]):
            for key in BOUNDS:
                if getattr(m, key, None) is not None:
                    found[key] = getattr(m, key)
    return found


def overrides(
    model: type[BaseModel], limits: Mapping[str, Mapping[str, float]] | None = None
) -> list[Override]:
    """The rows of a declaration, in its field order; ``limits``: the spec's bounds by field
    (they replace the declaration's of the same kind: ``le`` where it has none or a looser one)."""
    limits = limits or {}
    if unknown := set(limits) - set(model.model_fields):
        raise ValueError(f"limits for no field of {model.__name__}: {sorted(unknown)}")
    rows = []
    for name, info in model.model_fields.items():
        if not info.description:
            raise ValueError(f"{model.__name__}.{name}: no description (the CRD's, for kubectl explain)")
        bounds = {**_bounds(info), **limits.get(name, {})}
        bounds = {k: bounds[k] for k in BOUNDS if k in bounds}
        rows.append(
            Override(
                name=name,
                alias=info.alias or name,
                kind=_base(info.annotation),
                bounds=bounds,
                default=info.default,
                description=info.description,
            )
        )
    return rows


def _literal(value: float) -> str:
    """``0.5``, ``1000000``, ``1e15`` (not ``1000000000000000.0``): a Python literal of a bound."""
    text = repr(value)
    return f"{value:g}".replace("e+", "e") if isinstance(value, float) and "e" in f"{value:g}" else text


def _annotation(row: Override) -> str:
    """The spec model's type of a row: ``Ratio`` for a float 0..1, else ``Annotated[...]``."""
    if row.kind is float and row.bounds == {"ge": 0.0, "le": 1.0}:
        return "Ratio"  # spec.py's: a finite float from 0 to 1
    args = ", ".join(f"{k}={_literal(v)}" for k, v in row.bounds.items())
    parts = [row.kind.__name__, *([f"Field({args})"] if args else [])]
    if row.kind is float:
        parts.append("AfterValidator(_finite)")
    return f"Annotated[{', '.join(parts)}]"


def model_lines(row: Override, indent: int = 4) -> list[str]:
    """The spec model's field of a row, optional (None: the engine's default), as ruff formats
    it: one line, or the type in parentheses on its own line when that is too long."""
    line = f"{row.name}: {_annotation(row)} | None = None"
    if indent + len(line) <= LINE_LENGTH:
        return [line]
    return [f"{row.name}: (", f"    {_annotation(row)} | None", ") = None"]


def description(row: Override) -> str:
    """The CRD's description of a row: the declaration's, with the engine's default stated."""
    if row.default is None:
        return row.description
    default = f"{row.default:g}" if isinstance(row.default, float | int) else row.default
    return f"{row.description.removesuffix('.')} (default {default})."


def schema(row: Override) -> dict[str, Any]:
    """The CRD's OpenAPI property of a row (no ``default``: a CRD default would freeze today's
    value into every stored profile, so that an improved engine default never reaches it)."""
    kind = {float: "number", int: "integer", str: "string"}[row.kind]
    out: dict[str, Any] = {"type": kind, "description": description(row)}
    b = row.bounds
    if "gt" in b:
        out |= {"exclusiveMinimum": True, "minimum": b["gt"]}
    elif "ge" in b:
        out["minimum"] = b["ge"]
    if "le" in b:
        out["maximum"] = b["le"]
    elif "lt" in b:
        out |= {"exclusiveMaximum": True, "maximum": b["lt"]}
    if "min_length" in b:
        out["minLength"] = b["min_length"]
    if "max_length" in b:
        out["maxLength"] = b["max_length"]
    return out

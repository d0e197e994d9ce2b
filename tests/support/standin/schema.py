"""Structural-schema handling of custom resources, as the API server does it.

Order as in the API server: drop nulls of non-nullable fields, prune unknown fields (or report them
for `fieldValidation=Strict`), apply defaults, then validate. Error texts follow the API server's
(`spec.x: Invalid value: 0: spec.x in body should be greater than or equal to 1`).
"""

from __future__ import annotations

import json
import re
from functools import lru_cache
from typing import Any

from .patching import deepcopy

ROOT_FIELDS = ("apiVersion", "kind", "metadata")


def _show(value: Any) -> str:
    return json.dumps(value)


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


@lru_cache(maxsize=256)
def _regex(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern)


def _type_ok(value: Any, schema: dict[str, Any]) -> bool:
    kind = schema.get("type")
    if schema.get("x-kubernetes-int-or-string"):
        return (isinstance(value, int) and not isinstance(value, bool)) or isinstance(value, str)
    if kind is None:
        return True
    if kind == "object":
        return isinstance(value, dict)
    if kind == "array":
        return isinstance(value, list)
    if kind == "string":
        return isinstance(value, str)
    if kind == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "number":
        return isinstance(value, int | float) and not isinstance(value, bool)
    if kind == "boolean":
        return isinstance(value, bool)
    return True


def normalize(
    value: Any,
    schema: dict[str, Any],
    path: str,
    unknown: list[str],
    *,
    root: bool = False,
) -> Any:
    """Drop nulls, prune unknown fields (recording their paths), apply defaults. Mutates in place."""
    if isinstance(value, dict) and (schema.get("type") == "object" or "properties" in schema):
        properties: dict[str, Any] = schema.get("properties") or {}
        additional = schema.get("additionalProperties")
        preserve = bool(schema.get("x-kubernetes-preserve-unknown-fields"))
        for key in list(value):
            child = value[key]
            if root and key in ROOT_FIELDS:
                continue
            sub = properties.get(key)
            if sub is None and isinstance(additional, dict):
                sub = additional
            if sub is None:
                if not preserve and additional is not True:
                    unknown.append(_join(path, key))
                    del value[key]
                continue
            if child is None and not sub.get("nullable"):
                del value[key]
                continue
            value[key] = normalize(child, sub, _join(path, key), unknown)
        for key, sub in properties.items():
            if key not in value and "default" in sub:
                value[key] = normalize(deepcopy(sub["default"]), sub, _join(path, key), unknown)
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        items = schema["items"]
        for i, child in enumerate(value):
            value[i] = normalize(child, items, f"{path}[{i}]", unknown)
    return value


def validate(value: Any, schema: dict[str, Any], path: str, causes: list[dict[str, str]]) -> None:
    """Append API-server-style causes for every violation of the structural schema."""
    if value is None:
        if not schema.get("nullable") and schema.get("type"):
            causes.append(
                _cause(
                    "FieldValueInvalid",
                    path,
                    f'Invalid value: "null": {path} in body must be of type {schema["type"]}: "null"',
                )
            )
        return
    if not _type_ok(value, schema):
        kind = "integer,string" if schema.get("x-kubernetes-int-or-string") else schema.get("type")
        shown = type(value).__name__
        names = {
            "str": "string",
            "int": "integer",
            "float": "number",
            "bool": "boolean",
            "dict": "object",
            "list": "array",
        }
        causes.append(
            _cause(
                "FieldValueInvalid",
                path,
                f"Invalid value: {_show(names.get(shown, shown))}: "
                f"{path} in body must be of type {kind}: {_show(names.get(shown, shown))}",
            )
        )
        return
    enum = schema.get("enum")
    if enum is not None and value not in enum:
        supported = ", ".join(_show(v) for v in enum)
        causes.append(
            _cause(
                "FieldValueNotSupported",
                path,
                f"Unsupported value: {_show(value)}: supported values: {supported}",
            )
        )
    if isinstance(value, int | float) and not isinstance(value, bool):
        minimum, maximum = schema.get("minimum"), schema.get("maximum")
        if minimum is not None:
            if schema.get("exclusiveMinimum") and value <= minimum:
                causes.append(
                    _cause(
                        "FieldValueInvalid",
                        path,
                        f"Invalid value: {_show(value)}: {path} in body should be greater than {minimum}",
                    )
                )
            elif value < minimum:
                causes.append(
                    _cause(
                        "FieldValueInvalid",
                        path,
                        f"Invalid value: {_show(value)}: {path} in body should be greater than "
                        f"or equal to {minimum}",
                    )
                )
        if maximum is not None:
            if schema.get("exclusiveMaximum") and value >= maximum:
                causes.append(
                    _cause(
                        "FieldValueInvalid",
                        path,
                        f"Invalid value: {_show(value)}: {path} in body should be less than {maximum}",
                    )
                )
            elif value > maximum:
                causes.append(
                    _cause(
                        "FieldValueInvalid",
                        path,
                        f"Invalid value: {_show(value)}: {path} in body should be less than "
                        f"or equal to {maximum}",
                    )
                )
    elif isinstance(value, str):
        if "maxLength" in schema and len(value) > schema["maxLength"]:
            causes.append(
                _cause(
                    "FieldValueTooLong", path, f"Too long: may not be more than {schema['maxLength']} bytes"
                )
            )
        if "minLength" in schema and len(value) < schema["minLength"]:
            causes.append(
                _cause(
                    "FieldValueInvalid",
                    path,
                    f"Invalid value: {_show(value)}: {path} in body should be at least "
                    f"{schema['minLength']} chars long",
                )
            )
        if "pattern" in schema and not _regex(schema["pattern"]).search(value):
            causes.append(
                _cause(
                    "FieldValueInvalid",
                    path,
                    f"Invalid value: {_show(value)}: {path} in body should match '{schema['pattern']}'",
                )
            )
    elif isinstance(value, list):
        if "maxItems" in schema and len(value) > schema["maxItems"]:
            causes.append(
                _cause(
                    "FieldValueTooMany",
                    path,
                    f"Too many: {len(value)}: must have at most {schema['maxItems']} items",
                )
            )
        if "minItems" in schema and len(value) < schema["minItems"]:
            causes.append(
                _cause(
                    "FieldValueInvalid",
                    path,
                    f"Invalid value: {len(value)}: {path} in body should have at least "
                    f"{schema['minItems']} items",
                )
            )
        items = schema.get("items")
        if isinstance(items, dict):
            for i, child in enumerate(value):
                validate(child, items, f"{path}[{i}]", causes)
    elif isinstance(value, dict):
        properties: dict[str, Any] = schema.get("properties") or {}
        for key in schema.get("required") or []:
            if key not in value:
                causes.append(_cause("FieldValueRequired", _join(path, key), "Required value"))
        additional = schema.get("additionalProperties")
        for key, child in value.items():
            sub = properties.get(key)
            if sub is None and isinstance(additional, dict):
                sub = additional
            if sub is not None:
                validate(child, sub, _join(path, key), causes)
        if "maxProperties" in schema and len(value) > schema["maxProperties"]:
            causes.append(
                _cause(
                    "FieldValueTooMany",
                    path,
                    f"Too many: {len(value)}: must have at most {schema['maxProperties']} items",
                )
            )
        if "minProperties" in schema and len(value) < schema["minProperties"]:
            causes.append(
                _cause(
                    "FieldValueInvalid",
                    path,
                    f"Invalid value: {len(value)}: {path} in body should have at least "
                    f"{schema['minProperties']} properties",
                )
            )


def _cause(reason: str, field: str, message: str) -> dict[str, str]:
    return {"reason": reason, "message": message, "field": field}


def check_object(obj: dict[str, Any], schema: dict[str, Any]) -> tuple[list[str], list[dict[str, str]]]:
    """Normalize `obj` in place against the CRD schema; return (unknown field paths, causes)."""
    unknown: list[str] = []
    normalize(obj, schema, "", unknown, root=True)
    causes: list[dict[str, str]] = []
    body = {k: v for k, v in obj.items() if k not in ROOT_FIELDS}
    sub_schema = {k: v for k, v in schema.items() if k != "required"}
    required = [key for key in schema.get("required") or [] if key not in ROOT_FIELDS]
    for key in required:
        if key not in obj:
            causes.append(_cause("FieldValueRequired", key, "Required value"))
    validate(body, sub_schema, "", causes)
    return unknown, causes

"""Patch formats of the API server: JSON merge, JSON patch, strategic merge (approximate), apply."""

from __future__ import annotations

from typing import Any

from .errors import ApiError

# List fields that the built-in types merge by a key under strategic merge patch / server-side apply.
MERGE_KEYS: dict[str, str] = {
    "containers": "name",
    "initContainers": "name",
    "ephemeralContainers": "name",
    "env": "name",
    "envFrom": "",
    "volumes": "name",
    "volumeMounts": "mountPath",
    "volumeDevices": "devicePath",
    "ports": "containerPort",
    "conditions": "type",
    "imagePullSecrets": "name",
    "ownerReferences": "uid",
    "hostAliases": "ip",
    "webhooks": "name",
    "containerStatuses": "name",
    "initContainerStatuses": "name",
}
# Primitive lists merged as sets.
SET_LISTS = {"finalizers"}


def deepcopy(value: Any) -> Any:
    """A fast deep copy for JSON values."""
    if isinstance(value, dict):
        return {k: deepcopy(v) if isinstance(v, dict | list) else v for k, v in value.items()}
    if isinstance(value, list):
        return [deepcopy(v) if isinstance(v, dict | list) else v for v in value]
    return value


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch; returns the result (target may be reused)."""
    if not isinstance(patch, dict):
        return deepcopy(patch)
    result: dict[str, Any] = target if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise ApiError(422, "Invalid", f"invalid JSON pointer: {path!r}")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _index(container: list[Any], token: str, *, for_add: bool) -> int:
    if token == "-" and for_add:
        return len(container)
    if not token.isdigit():
        raise ApiError(422, "Invalid", f"invalid array index: {token!r}")
    index = int(token)
    limit = len(container) if for_add else len(container) - 1
    if index > limit:
        raise ApiError(422, "Invalid", f"array index out of bounds: {index}")
    return index


def _parent(doc: Any, tokens: list[str], path: str) -> Any:
    node = doc
    for token in tokens[:-1]:
        if isinstance(node, dict) and token in node:
            node = node[token]
        elif isinstance(node, list):
            node = node[_index(node, token, for_add=False)]
        else:
            raise ApiError(
                422,
                "Invalid",
                f"the server rejected our request due to an error in our request: "
                f"doc is missing path: {path!r}",
            )
    return node


def _get(doc: Any, path: str) -> Any:
    tokens = _pointer(path)
    if not tokens:
        return doc
    parent = _parent(doc, tokens, path)
    last = tokens[-1]
    if isinstance(parent, dict) and last in parent:
        return parent[last]
    if isinstance(parent, list):
        return parent[_index(parent, last, for_add=False)]
    raise ApiError(422, "Invalid", f"doc is missing path: {path!r}")


def _remove(doc: Any, path: str) -> Any:
    tokens = _pointer(path)
    parent = _parent(doc, tokens, path)
    last = tokens[-1]
    if isinstance(parent, dict) and last in parent:
        return parent.pop(last)
    if isinstance(parent, list):
        return parent.pop(_index(parent, last, for_add=False))
    raise ApiError(422, "Invalid", f"doc is missing path: {path!r}: missing value")


def _add(doc: Any, path: str, value: Any, *, replace: bool) -> Any:
    tokens = _pointer(path)
    if not tokens:
        return value
    parent = _parent(doc, tokens, path)
    last = tokens[-1]
    if isinstance(parent, dict):
        if replace and last not in parent:
            raise ApiError(422, "Invalid", f"doc is missing key: {path!r}: missing value")
        parent[last] = value
    elif isinstance(parent, list):
        if replace:
            parent[_index(parent, last, for_add=False)] = value
        else:
            parent.insert(_index(parent, last, for_add=True), value)
    else:
        raise ApiError(422, "Invalid", f"doc is missing path: {path!r}")
    return doc


def json_patch(doc: Any, operations: Any) -> Any:
    """RFC 6902 JSON patch applied to (and mutating) `doc`; returns the result."""
    if not isinstance(operations, list):
        raise ApiError.bad_request("json patch must be a list of operations")
    for op in operations:
        if not isinstance(op, dict) or "op" not in op or "path" not in op:
            raise ApiError.bad_request(f"invalid json patch operation: {op!r}")
        kind, path = op["op"], op["path"]
        if kind == "add":
            doc = _add(doc, path, deepcopy(op.get("value")), replace=False)
        elif kind == "replace":
            doc = _add(doc, path, deepcopy(op.get("value")), replace=True)
        elif kind == "remove":
            _remove(doc, path)
        elif kind == "move":
            value = _remove(doc, op["from"])
            doc = _add(doc, path, value, replace=False)
        elif kind == "copy":
            doc = _add(doc, path, deepcopy(_get(doc, op["from"])), replace=False)
        elif kind == "test":
            if _get(doc, path) != op.get("value"):
                raise ApiError(422, "Invalid", f"testing value {path} failed")
        else:
            raise ApiError.bad_request(f"unexpected json patch operation: {kind!r}")
    return doc


def _merge_keyed_list(target: list[Any], patch: list[Any], key: str, *, apply: bool) -> list[Any]:
    result = list(target)
    positions = {item.get(key): i for i, item in enumerate(result) if isinstance(item, dict)}
    for item in patch:
        if not isinstance(item, dict) or key not in item:
            result.append(deepcopy(item))
            continue
        directive = item.get("$patch")
        position = positions.get(item[key])
        if directive == "delete":
            if position is not None:
                result[position] = None
            continue
        clean = {k: v for k, v in item.items() if k != "$patch"}
        if position is None:
            positions[item[key]] = len(result)
            result.append(_strip_directives(clean))
        elif directive == "replace":
            result[position] = _strip_directives(clean)
        else:
            result[position] = strategic_merge(result[position], clean, apply=apply)
    return [item for item in result if item is not None]


def _strip_directives(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _strip_directives(v) for k, v in value.items() if not k.startswith("$") and v is not None}
    if isinstance(value, list):
        return [_strip_directives(v) for v in value]
    return value


def strategic_merge(target: Any, patch: Any, *, apply: bool = False) -> Any:
    """An approximation of strategic merge patch: merge patch, but lists of containers, env,
    volumes, ports, conditions, … merge by their key, `finalizers` merge as a set, and the
    `$patch`/`$deleteFromPrimitiveList`/`$setElementOrder`/`$retainKeys` directives are honoured
    or dropped. `apply=True` gives the same merge for server-side apply."""
    if not isinstance(patch, dict):
        return deepcopy(patch)
    if patch.get("$patch") == "replace":
        return _strip_directives({k: v for k, v in patch.items() if k != "$patch"})
    if patch.get("$patch") == "delete":
        return None
    result: dict[str, Any] = target if isinstance(target, dict) else {}
    for key, value in patch.items():
        if key.startswith("$deleteFromPrimitiveList/"):
            field = key.split("/", 1)[1]
            if isinstance(result.get(field), list):
                result[field] = [v for v in result[field] if v not in (value or [])]
            continue
        if key.startswith("$"):
            continue
        if value is None:
            result.pop(key, None)
        elif isinstance(value, list) and isinstance(result.get(key), list):
            merge_key = MERGE_KEYS.get(key)
            if merge_key:
                result[key] = _merge_keyed_list(result[key], value, merge_key, apply=apply)
            elif key in SET_LISTS:
                merged = list(result[key])
                merged.extend(v for v in value if v not in merged)
                result[key] = merged
            else:
                result[key] = _strip_directives(value)
        elif isinstance(value, dict):
            merged_value = strategic_merge(result.get(key), value, apply=apply)
            if merged_value is None:
                result.pop(key, None)
            else:
                result[key] = merged_value
        else:
            result[key] = value
    return result


def leaf_paths(value: Any, prefix: tuple[str, ...] = ()) -> set[tuple[str, ...]]:
    """Paths of the leaves of nested maps (lists are leaves): the fields an applier owns."""
    if not isinstance(value, dict) or not value:
        return {prefix} if prefix else set()
    paths: set[tuple[str, ...]] = set()
    for key, child in value.items():
        paths |= leaf_paths(child, (*prefix, key))
    return paths


def remove_path(obj: dict[str, Any], path: tuple[str, ...]) -> None:
    """Remove a nested key and any maps it leaves empty."""
    node: Any = obj
    parents: list[tuple[dict[str, Any], str]] = []
    for key in path[:-1]:
        if not isinstance(node, dict) or key not in node:
            return
        parents.append((node, key))
        node = node[key]
    if isinstance(node, dict):
        node.pop(path[-1], None)
        for parent, key in reversed(parents):
            if parent[key] == {}:
                del parent[key]
            else:
                break

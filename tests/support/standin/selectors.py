"""Label and field selectors, parsed once and matched cheaply (as the API server does)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .errors import ApiError

_SET_TERM = re.compile(r"^\s*([A-Za-z0-9_./-]+)\s+(in|notin)\s*\(([^)]*)\)\s*$")
_CMP_TERM = re.compile(r"^\s*([A-Za-z0-9_./-]+)\s*(==|!=|=|>|<)\s*([A-Za-z0-9_.-]*)\s*$")
_KEY_TERM = re.compile(r"^\s*(!?)\s*([A-Za-z0-9_./-]+)\s*$")


@dataclass(frozen=True, slots=True)
class Requirement:
    key: str
    op: str  # in, notin, exists, !exists, gt, lt
    values: frozenset[str]

    def matches(self, labels: Mapping[str, str]) -> bool:
        op = self.op
        if op == "in":
            return labels.get(self.key) in self.values
        if op == "notin":
            return labels.get(self.key) not in self.values
        if op == "exists":
            return self.key in labels
        if op == "!exists":
            return self.key not in labels
        value = labels.get(self.key)
        if value is None:
            return False
        try:
            number = int(value)
        except ValueError:
            return False
        (limit,) = self.values
        return number > int(limit) if op == "gt" else number < int(limit)


def _split_terms(text: str) -> list[str]:
    terms: list[str] = []
    depth = 0
    current: list[str] = []
    for char in text:
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        if char == "," and depth == 0:
            terms.append("".join(current))
            current = []
        else:
            current.append(char)
    terms.append("".join(current))
    return [term for term in terms if term.strip()]


@dataclass(frozen=True, slots=True)
class LabelSelector:
    requirements: tuple[Requirement, ...] = ()

    @classmethod
    def parse(cls, text: str | None) -> LabelSelector:
        """Parse `a=b,c!=d,e in (x,y),f notin (z),g,!h` (the API server's syntax)."""
        if not text:
            return cls()
        requirements: list[Requirement] = []
        for term in _split_terms(text):
            if m := _SET_TERM.match(term):
                values = frozenset(v.strip() for v in m.group(3).split(",") if v.strip())
                requirements.append(Requirement(m.group(1), m.group(2), values))
            elif m := _CMP_TERM.match(term):
                op = m.group(2)
                if op in ("=", "=="):
                    requirements.append(Requirement(m.group(1), "in", frozenset([m.group(3)])))
                elif op == "!=":
                    requirements.append(Requirement(m.group(1), "notin", frozenset([m.group(3)])))
                else:
                    if not m.group(3).lstrip("-").isdigit():
                        raise ApiError.bad_request(f"unable to parse requirement: {term.strip()!r}")
                    kind = "gt" if op == ">" else "lt"
                    requirements.append(Requirement(m.group(1), kind, frozenset([m.group(3)])))
            elif m := _KEY_TERM.match(term):
                op = "!exists" if m.group(1) else "exists"
                requirements.append(Requirement(m.group(2), op, frozenset()))
            else:
                raise ApiError.bad_request(f"unable to parse requirement: {term.strip()!r}")
        return cls(tuple(requirements))

    @classmethod
    def from_object(cls, selector: Mapping[str, Any] | None) -> LabelSelector:
        """A metav1.LabelSelector (matchLabels + matchExpressions); None/{} selects everything."""
        if not selector:
            return cls()
        requirements = [
            Requirement(str(k), "in", frozenset([str(v)]))
            for k, v in (selector.get("matchLabels") or {}).items()
        ]
        ops = {"In": "in", "NotIn": "notin", "Exists": "exists", "DoesNotExist": "!exists"}
        for expression in selector.get("matchExpressions") or []:
            op = ops.get(expression.get("operator", ""))
            if op is None:
                raise ApiError.bad_request(f"invalid label selector operator: {expression.get('operator')!r}")
            values = frozenset(str(v) for v in expression.get("values") or [])
            requirements.append(Requirement(str(expression.get("key", "")), op, values))
        return cls(tuple(requirements))

    def __bool__(self) -> bool:
        return bool(self.requirements)

    def matches(self, labels: Mapping[str, str] | None) -> bool:
        labels = labels or {}
        return all(requirement.matches(labels) for requirement in self.requirements)


def _lookup(obj: Mapping[str, Any], path: tuple[str, ...]) -> str:
    value: Any = obj
    for part in path:
        if not isinstance(value, Mapping):
            return ""
        value = value.get(part)
        if value is None:
            return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


@dataclass(frozen=True, slots=True)
class FieldSelector:
    """`metadata.name=x,involvedObject.kind!=Pod`: any dotted path, compared as strings."""

    terms: tuple[tuple[tuple[str, ...], bool, str], ...] = ()

    @classmethod
    def parse(cls, text: str | None) -> FieldSelector:
        if not text:
            return cls()
        terms: list[tuple[tuple[str, ...], bool, str]] = []
        for term in _split_terms(text):
            if "!=" in term:
                key, value = term.split("!=", 1)
                equal = False
            elif "==" in term:
                key, value = term.split("==", 1)
                equal = True
            elif "=" in term:
                key, value = term.split("=", 1)
                equal = True
            else:
                raise ApiError.bad_request(f"invalid field selector: {term.strip()!r}: expected key=value")
            terms.append((tuple(key.strip().split(".")), equal, value.strip()))
        return cls(tuple(terms))

    def __bool__(self) -> bool:
        return bool(self.terms)

    def exact_name(self) -> str | None:
        """The name when the selector pins `metadata.name=X` (served by an O(1) lookup)."""
        for path, equal, value in self.terms:
            if equal and path == ("metadata", "name"):
                return value
        return None

    def matches(self, obj: Mapping[str, Any]) -> bool:
        return all((_lookup(obj, path) == value) == equal for path, equal, value in self.terms)

"""A strict reader of the Prometheus text exposition format (0.0.4).

Used by ``dam evaluate`` (snapshots on disk), the operator's direct scrape and
the tests. Errors name the source, the line and the problem, so that a user
who hands us a garbage file learns exactly what is wrong with it.
"""

from __future__ import annotations

import math
import re
from array import array
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
_LINE = re.compile(rf"^(?P<name>{_NAME})(?:\{{(?P<labels>.*)\}})?\s+(?P<value>\S+)(?:\s+(?P<ts>-?\d+))?\s*$")
_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*(,|$)')
_MAX_LINE = 64 * 1024


class PromParseError(ValueError):
    """Malformed exposition text; ``str()`` reads ``source:line: problem``."""

    def __init__(self, source: str, line: int, problem: str) -> None:
        super().__init__(f"{source}:{line}: {problem}")
        self.source = source
        self.line = line
        self.problem = problem


Labels = tuple[tuple[str, str], ...]


@dataclass(frozen=True, slots=True)
class Sample:
    name: str
    labels: Labels
    value: float

    def label(self, key: str, default: str = "") -> str:
        for k, v in self.labels:
            if k == key:
                return v
        return default


class Snapshot:
    """All samples of one scrape, indexed by metric name."""

    def __init__(self, samples: Iterable[Sample], timestamp_seconds: float | None = None) -> None:
        self._by_name: dict[str, list[Sample]] = {}
        for s in samples:
            self._by_name.setdefault(s.name, []).append(s)
        self.timestamp_seconds = timestamp_seconds

    def samples(self, name: str) -> list[Sample]:
        return list(self._by_name.get(name, ()))

    def names(self) -> set[str]:
        return set(self._by_name)

    def series(self, name: str) -> dict[Labels, float]:
        return {s.labels: s.value for s in self._by_name.get(name, ())}

    def __len__(self) -> int:
        return sum(len(v) for v in self._by_name.values())


_MAX_INTERNED_LAYOUTS = 1024
_layouts: dict[tuple[tuple[str, Labels], ...], tuple[tuple[str, Labels], ...]] = {}
"""Series layouts (names and labels, in order) shared by compact snapshots; pods of one job export
the same layout, so thousands of snapshots share a handful. Bounded: past the limit a layout is
simply not shared."""


class CompactSnapshot(Snapshot):
    """The same samples as a ``Snapshot``, held as a shared series layout and an array of floats.

    For what is kept for a long time, e.g. the operator's previous scrape of every pod (10,000
    pods at 5,000 profiles): about 0.3 KB a pod instead of 1.5 KB of ``Sample`` objects and
    lists. Reads build their answers on the fly.
    """

    def __init__(self, samples: Iterable[Sample], timestamp_seconds: float | None = None) -> None:
        items = list(samples)
        layout = tuple((s.name, s.labels) for s in items)
        shared = _layouts.get(layout)
        if shared is None:
            shared = layout
            if len(_layouts) < _MAX_INTERNED_LAYOUTS:
                _layouts[layout] = layout
        self._layout = shared
        self._values = array("d", (s.value for s in items))
        self.timestamp_seconds = timestamp_seconds

    def samples(self, name: str) -> list[Sample]:
        return [
            Sample(n, labels, v)
            for (n, labels), v in zip(self._layout, self._values, strict=True)
            if n == name
        ]

    def names(self) -> set[str]:
        return {n for n, _ in self._layout}

    def series(self, name: str) -> dict[Labels, float]:
        return {labels: v for (n, labels), v in zip(self._layout, self._values, strict=True) if n == name}

    def __len__(self) -> int:
        return len(self._values)


def _unescape(v: str) -> str:
    return v.replace("\\\\", "\0").replace('\\"', '"').replace("\\n", "\n").replace("\0", "\\")


def _parse_value(raw: str) -> float:
    low = raw.lower()
    if low in ("nan",):
        return math.nan
    if low in ("+inf", "inf"):
        return math.inf
    if low == "-inf":
        return -math.inf
    return float(raw)


def _parse_labels(text: str, source: str, lineno: int) -> Labels:
    out: list[tuple[str, str]] = []
    pos = 0
    text = text.strip()
    while pos < len(text):
        m = _LABEL.match(text, pos)
        if not m:
            raise PromParseError(source, lineno, f"malformed label set {{{text[:80]}}}")
        out.append((m.group(1), _unescape(m.group(2))))
        pos = m.end()
    keys = [k for k, _ in out]
    if len(keys) != len(set(keys)):
        raise PromParseError(source, lineno, "duplicate label name")
    return tuple(sorted(out))


def parse(text: str, source: str = "<text>") -> list[Sample]:
    """Parse exposition text into samples. Raises PromParseError on the first bad line."""
    samples: list[Sample] = []
    seen: set[tuple[str, Labels]] = set()
    for lineno, line in enumerate(text.splitlines(), start=1):
        if len(line) > _MAX_LINE:
            raise PromParseError(source, lineno, f"line longer than {_MAX_LINE} characters")
        stripped = line.strip()
        if stripped == "# EOF":
            break
        if not stripped or stripped.startswith("#"):
            if stripped.startswith("# TYPE") or stripped.startswith("# HELP"):
                parts = stripped.split(None, 3)
                if len(parts) < 3 or not re.fullmatch(_NAME, parts[2]):
                    raise PromParseError(
                        source, lineno, f"malformed {parts[1] if len(parts) > 1 else ''} line"
                    )
            continue
        m = _LINE.match(stripped)
        if not m:
            raise PromParseError(source, lineno, f"not a sample line: {stripped[:80]!r}")
        labels = _parse_labels(m.group("labels") or "", source, lineno)
        try:
            value = _parse_value(m.group("value"))
        except ValueError:
            raise PromParseError(source, lineno, f"value {m.group('value')[:40]!r} is not a number") from None
        key = (m.group("name"), labels)
        if key in seen:
            raise PromParseError(source, lineno, f"duplicate series {m.group('name')}")
        seen.add(key)
        samples.append(Sample(m.group("name"), labels, value))
    return samples


def parse_snapshot(text: str, source: str = "<text>", timestamp_seconds: float | None = None) -> Snapshot:
    return Snapshot(parse(text, source), timestamp_seconds)


def labels_of(mapping: Mapping[str, str]) -> Labels:
    return tuple(sorted(mapping.items()))

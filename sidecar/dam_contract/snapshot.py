"""A strict, streaming reader of the Prometheus text exposition format (0.0.4).

Used by ``dam evaluate`` (snapshots on disk), the operator's direct scrape and
the tests. Errors name the source, the line and the problem, so that a user
who hands us a garbage file learns exactly what is wrong with it.

Two ways in:

- ``parse(text)`` / ``parse_snapshot(text)``: text already in memory (a scrape's body,
  which the caller has size-capped), every series kept;
- ``read_snapshot(fh, keep=..., max_series=...)``: a file read line by line, lines
  longer than ``max_line`` refused before they are read whole, and only the series
  whose name ``keep`` accepts held in memory (the others are checked and dropped),
  with at most ``max_series`` of them (``TooManySeriesError`` past that). A 100 MB
  file of 1.2 M series costs what its kept series cost, not 1.5 GB of ``Sample``
  objects. ``iter_samples`` is the generator both are built on.

Every line is checked the same way whichever way it came in: a sample line is
``name{label="value",...} value [timestamp]``, with a value Prometheus itself
accepts (a decimal or exponent float, ``NaN``, ``+Inf``, ``-Inf``); NaN, infinite
and negative values are returned as they are: what they mean is the reader's call.
Lines are separated by ``\n`` only (a label value may hold any other character).
"""

from __future__ import annotations

import math
import re
from array import array
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TextIO

_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
_LABEL_NAME = r"[a-zA-Z_][a-zA-Z0-9_]*"
_LABEL_VALUE = r'"(?:[^"\\]|\\.)*"'
_PAIR = rf"{_LABEL_NAME}\s*=\s*{_LABEL_VALUE}"
# Every run of blanks has one place in the grammar (no "\s*\s*"): matching stays linear in the
# line's length whatever the line (a nested-blank grammar took 88 s on one 60,000-blank line).
_LABEL_SET = rf"\s*(?:{_PAIR}\s*(?:,\s*{_PAIR}\s*)*(?:,\s*)?)?"
_SAMPLE = re.compile(
    rf"(?P<name>{_NAME})(?:\{{(?P<labels>{_LABEL_SET})\}})?\s+(?P<value>\S+)(?:\s+(?P<ts>-?\d+))?\s*",
    re.ASCII,  # \d is 0-9 only (int() would read other scripts' digits), \s the ASCII blanks
)
"""A whole sample line (after ``strip()``), labels checked by the grammar itself."""
_LOOSE = re.compile(rf"(?P<name>{_NAME})(?P<brace>\{{)?")
"""Enough of a line to say what is wrong with one that ``_SAMPLE`` refused."""
_PAIR_PARTS = re.compile(rf"({_LABEL_NAME})\s*=\s*\"((?:[^\"\\]|\\.)*)\"")
_NUMBER = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?", re.ASCII)
_ESCAPE = re.compile(r"\\(.)")
_MAX_LINE = 64 * 1024
MAX_LINE_CHARACTERS = _MAX_LINE
"""The longest line any reader here accepts (characters, the newline not counted)."""


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


_UNESCAPES = {"\\": "\\", '"': '"', "n": "\n"}


def _unescape(v: str) -> str:
    """One pass, so that ``\\\\n`` stays a backslash and an ``n`` (unknown escapes kept as written)."""
    if "\\" not in v:
        return v
    return _ESCAPE.sub(lambda m: _UNESCAPES.get(m.group(1), m.group(0)), v)


def _parse_value(raw: str) -> float:
    if _NUMBER.fullmatch(raw):
        return float(raw)
    low = raw.lower()
    if low == "nan":
        return math.nan
    if low in ("+inf", "inf"):
        return math.inf
    if low == "-inf":
        return -math.inf
    raise ValueError(raw)


def _parse_labels(text: str, source: str, lineno: int) -> Labels:
    """The pairs of a label set that ``_SAMPLE`` has already checked, sorted."""
    pairs: list[tuple[str, str]] = _PAIR_PARTS.findall(text)
    out = pairs if "\\" not in text else [(k, _unescape(v)) for k, v in pairs]
    if len({k for k, _ in out}) != len(out):
        raise PromParseError(source, lineno, "duplicate label name")
    return tuple(sorted(out))


_HEAD = re.compile(rf"{_NAME}(?:\{{{_LABEL_SET}\}})?")


def _what_is_wrong(stripped: str) -> str:
    shown = repr(stripped[:80])
    head = _HEAD.match(stripped)
    if head is not None and head.end() == len(stripped):
        return f"no value after the series: {shown}"
    loose = _LOOSE.match(stripped)
    if loose is not None and loose.group("brace") and (head is None or head.end() == loose.end("name")):
        return f'malformed label set in {shown} (expected name="value" pairs, comma-separated)'
    return f"not a sample line: {shown}"


class TooManySeriesError(PromParseError):
    """More series to keep than the reader's ``max_series``."""

    def __init__(self, source: str, line: int, limit: int, name: str) -> None:
        super().__init__(source, line, f"more than {limit} series to keep (cap reached at {name})")
        self.limit = limit
        self.name = name


DROPPED_NAMES_SHOWN = 5


@dataclass
class ParseStats:
    """What a read saw besides the samples it returned (filled in as it goes)."""

    lines: int = 0
    samples: int = 0
    """Sample lines read, kept or not."""
    kept: int = 0
    dropped_names: list[str] = field(default_factory=list)
    """The first distinct names that ``keep`` refused (at most ``DROPPED_NAMES_SHOWN``)."""
    newest_timestamp_ms: int | None = None
    """The largest sample timestamp (milliseconds) among the kept lines that carry one."""


def iter_samples(
    lines: Iterable[str],
    source: str = "<text>",
    *,
    keep: Callable[[str], bool] | None = None,
    max_series: int | None = None,
    max_line: int = _MAX_LINE,
    stats: ParseStats | None = None,
) -> Iterator[Sample]:
    """The samples of exposition lines (no newlines), one at a time; PromParseError on the first bad line.

    Every line is checked; only those whose name ``keep`` accepts (all when None) are
    returned, duplicates among them refused, and at most ``max_series`` of them
    (``TooManySeriesError`` on the next). Memory: the kept series' keys, nothing per
    dropped line.
    """
    st = stats if stats is not None else ParseStats()
    seen: set[tuple[str, Labels]] = set()
    for lineno, line in enumerate(lines, start=1):
        st.lines = lineno
        if len(line) > max_line:
            raise PromParseError(source, lineno, f"line longer than {max_line} characters")
        stripped = line.strip()
        if not stripped:
            continue
        if stripped[0] == "#":
            if stripped == "# EOF":
                break
            if stripped.startswith("# TYPE") or stripped.startswith("# HELP"):
                parts = stripped.split(None, 3)
                if len(parts) < 3 or not re.fullmatch(_NAME, parts[2]):
                    raise PromParseError(
                        source, lineno, f"malformed {parts[1] if len(parts) > 1 else ''} line"
                    )
            continue
        m = _SAMPLE.fullmatch(stripped)
        if m is None:
            raise PromParseError(source, lineno, _what_is_wrong(stripped))
        try:
            value = _parse_value(m.group("value"))
        except ValueError:
            raise PromParseError(source, lineno, f"value {m.group('value')[:40]!r} is not a number") from None
        st.samples += 1
        name = m.group("name")
        if keep is not None and not keep(name):
            if len(st.dropped_names) < DROPPED_NAMES_SHOWN and name not in st.dropped_names:
                st.dropped_names.append(name)
            continue
        labels = _parse_labels(m.group("labels") or "", source, lineno)
        key = (name, labels)
        if key in seen:
            raise PromParseError(source, lineno, f"duplicate series {name}")
        if max_series is not None and len(seen) >= max_series:
            raise TooManySeriesError(source, lineno, max_series, name)
        seen.add(key)
        st.kept += 1
        ts = m.group("ts")
        if ts is not None and (st.newest_timestamp_ms is None or int(ts) > st.newest_timestamp_ms):
            st.newest_timestamp_ms = int(ts)
        yield Sample(name, labels, value)


def _text_lines(text: str) -> Iterator[str]:
    """The lines of ``text`` split at ``\\n`` only, one at a time (no list of them all)."""
    start, size = 0, len(text)
    while start < size:
        end = text.find("\n", start)
        if end < 0:
            yield text[start:]
            return
        yield text[start:end]
        start = end + 1


def _file_lines(fh: TextIO, max_line: int) -> Iterator[str]:
    """The lines of an open text file, none read past ``max_line + 1`` characters.

    A longer line comes out cut at ``max_line + 1`` characters, which ``iter_samples``
    refuses: a file that is one endless line costs ``max_line`` characters, not its size.
    Open the file with ``newline="\\n"`` so that only ``\\n`` ends a line.
    """
    while True:
        line = fh.readline(max_line + 2)
        if not line:
            return
        if line.endswith("\n"):
            yield line[:-1]
        else:
            yield line  # the last line, or a cut one (then longer than max_line)
            if len(line) > max_line:
                return


def parse(text: str, source: str = "<text>") -> list[Sample]:
    """Parse exposition text into samples. Raises PromParseError on the first bad line."""
    return list(iter_samples(_text_lines(text), source))


def parse_snapshot(
    text: str,
    source: str = "<text>",
    timestamp_seconds: float | None = None,
    *,
    keep: Callable[[str], bool] | None = None,
    max_series: int | None = None,
    stats: ParseStats | None = None,
) -> Snapshot:
    """A ``Snapshot`` of exposition text; ``keep``, ``max_series`` as in ``iter_samples``."""
    samples = iter_samples(_text_lines(text), source, keep=keep, max_series=max_series, stats=stats)
    return Snapshot(samples, timestamp_seconds)


def read_snapshot(
    fh: TextIO,
    source: str,
    *,
    keep: Callable[[str], bool] | None = None,
    max_series: int | None = None,
    max_line: int = _MAX_LINE,
    stats: ParseStats | None = None,
) -> Snapshot:
    """A ``Snapshot`` of an open exposition file, read line by line (see ``iter_samples``).

    Memory: the kept series, plus one line; the file's size does not matter.
    """
    lines = _file_lines(fh, max_line)
    samples = iter_samples(lines, source, keep=keep, max_series=max_series, max_line=max_line, stats=stats)
    return Snapshot(samples)


def labels_of(mapping: Mapping[str, str]) -> Labels:
    return tuple(sorted(mapping.items()))

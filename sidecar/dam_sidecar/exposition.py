"""A fast renderer of the Prometheus text format (0.0.4) for already-built metric families.

``prometheus_client.exposition.generate_latest`` validates and escapes every
label on every scrape (about 3.5 ms for 8 GPUs' worth of series). The sidecar
renders once per sample instead, with this, and serves the cached bytes; a
unit test checks that the output parses to the same samples as the library's.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from functools import lru_cache

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric


def _escape_help(text: str) -> str:
    return text.replace("\\", r"\\").replace("\n", r"\n")


def _escape_value(text: str) -> str:
    if "\\" not in text and "\n" not in text and '"' not in text:
        return text
    return text.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


@lru_cache(maxsize=8192)
def _label_text(names: tuple[str, ...], values: tuple[str, ...]) -> str:
    """``{k="v",...}`` for one label set; label sets are bounded, so each is rendered once."""
    return "{" + ",".join(f'{k}="{_escape_value(v)}"' for k, v in zip(names, values, strict=True)) + "}"


def format_value(value: float) -> str:
    if value == math.inf:
        return "+Inf"
    if value == -math.inf:
        return "-Inf"
    if math.isnan(value):
        return "NaN"
    return repr(float(value))


class Family:
    """One metric family as plain data: cheaper to build each tick than the client library's.

    With ``optional_labels``, a label whose value is the empty string is left
    out of that sample (Prometheus treats an empty label as an absent one), so
    one family can hold ``dam_steps_total`` and ``dam_steps_total{rank="0"}``.
    """

    __slots__ = ("documentation", "label_names", "name", "optional_labels", "samples", "type")

    def __init__(
        self,
        name: str,
        kind: str,
        documentation: str,
        label_names: Sequence[str] = (),
        optional_labels: bool = False,
    ) -> None:
        self.name = name  # the full name; counters keep their ``_total``
        self.type = kind
        self.documentation = documentation
        self.label_names = tuple(label_names)
        self.optional_labels = optional_labels
        self.samples: list[tuple[tuple[str, ...], float]] = []

    def add_metric(self, values: Sequence[str], value: float) -> None:
        self.samples.append((tuple(values), float(value)))

    def _present(self, values: tuple[str, ...]) -> tuple[tuple[str, ...], tuple[str, ...]]:
        if not self.optional_labels:
            return self.label_names, values
        kept = [(k, v) for k, v in zip(self.label_names, values, strict=True) if v != ""]
        return tuple(k for k, _ in kept), tuple(v for _, v in kept)

    def to_metric(self) -> Metric:
        """The prometheus_client family (for registries and the OpenMetrics encoder)."""
        labels = [] if self.optional_labels else list(self.label_names)
        if self.type == "counter":
            fam: Metric = CounterMetricFamily(self.name, self.documentation, labels=labels)
        else:
            fam = GaugeMetricFamily(self.name, self.documentation, labels=labels)
        for values, value in self.samples:
            if self.optional_labels:
                names, kept = self._present(values)
                sample_name = fam.name + "_total" if self.type == "counter" else fam.name
                fam.add_sample(sample_name, dict(zip(names, kept, strict=True)), value)
            else:
                fam.add_metric(list(values), value)  # type: ignore[attr-defined]
        return fam


def render(families: Iterable[Family]) -> bytes:
    out: list[str] = []
    for fam in families:
        name = fam.name
        out.append(f"# HELP {name} {_escape_help(fam.documentation)}\n# TYPE {name} {fam.type}\n")
        names = fam.label_names
        for values, value in fam.samples:
            if fam.optional_labels:
                present, kept = fam._present(values)
                labels = _label_text(present, kept) if present else ""
                out.append(f"{name}{labels} {format_value(value)}\n")
            elif names:
                out.append(f"{name}{_label_text(names, values)} {format_value(value)}\n")
            else:
                out.append(f"{name} {format_value(value)}\n")
    return "".join(out).encode("utf-8")

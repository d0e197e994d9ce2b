"""Data types of the diagnosis engine's answer: the verdict (``Verdict``: ``Bottleneck``, its
``Straggler``, ``WindowMetrics``). What goes in (a window's ``Observation``, ``Thresholds``,
``Hardware``, ``RankId``) is the leaf ``diagnosis.observation``, named here too; the verdict's
``Axis`` and ``Regime`` are the leaf ``diagnosis.axes``.

Field names on the wire (JSON, the resource status) are camelCase aliases of the snake_case
Python names; ``model_dump(by_alias=True)`` gives the status shape of docs/architecture.md
(the DAMProfile resource). Pure data: no I/O, no Kubernetes, no NVML.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Self

from pydantic import (
    ConfigDict,
    Field,
    PrivateAttr,
    SerializationInfo,
    SerializerFunctionWrapHandler,
    model_serializer,
    model_validator,
)

from dam_operator.diagnosis import signals
from dam_operator.diagnosis.axes import Axis, Regime
from dam_operator.diagnosis.evidence import Evidence, note
from dam_operator.diagnosis.observation import (
    Hardware,
    NonNeg,
    Observation,
    RankId,
    RankNumber,
    Ratio,
    Thresholds,
    _Wire,
)

__all__ = [
    "Axis",
    "Bottleneck",
    "Hardware",
    "IronLaw",
    "NonNeg",
    "Observation",
    "RankFigures",
    "RankId",
    "RankNumber",
    "Ratio",
    "Regime",
    "Straggler",
    "Thresholds",
    "Verdict",
    "WindowMetrics",
    "_Wire",
]
"""The verdict's types, and the input's and the names a verdict gives (from their leaves) for
the code that reads them from here."""


class IronLaw(_Wire):
    """Per-step estimate of the iron-law terms, seconds (None where inputs are missing)."""

    step_seconds: float | None = None
    data_seconds: float | None = None
    compute_seconds: float | None = None
    latency_seconds: float | None = None


class RankFigures(_Wire):
    """One rank's figures in ``status.metrics.ranks`` (and ``dam run --json`` ``ranks``)."""

    rank: int | None = None
    pod: str | None = None
    steps_per_second: float | None = None
    data_wait_ratio: float | None = None
    collective_ratio: float | None = None
    exposed_ratio: float | None = None


_FLAT = ConfigDict(**_Wire.model_config, ser_json_inf_nan="constants")
"""The config of a model that holds ``WindowMetrics`` at the top of a dump: the flat dict its
serializer returns is serialized again by inference, which follows the top model's config, and
there an infinite figure stays infinite, as a declared float field keeps it in
``model_dump(mode="json")``."""


class WindowMetrics(_Wire):
    """``status.metrics``: the window's figures.

    Two kinds, and none written twice: the signals' own figures come from the signal table
    (``signals.STATUS_SIGNALS``: each entry with a status key), held in ``shown``, an
    ``Observation`` with those fields set and the others None; the figures the engine derives
    (the rate, MFU, the roofline, the iron law, the ranks) are the fields declared here. A new
    signal with a status key needs no field here: its table entry is enough (deploy/render.py
    writes the CRD's ``status.metrics`` schema from the same entries).

    ``WindowMetrics(data_wait_ratio=0.4, mfu=0.3)`` takes a shown signal by its field name or
    its status key (``engine`` passes ``signals.status_values(obs)``). The wire form
    (``model_dump(by_alias=True)``) is flat: the shown signals in table order, then the derived.
    Typed code reads a shown signal as ``metrics.shown.data_wait_ratio``; ``metrics.data_wait_ratio``
    works too at run time (not for the type checker).
    """

    model_config = _FLAT

    shown: Observation = Field(default_factory=Observation, exclude=True)
    """The signals the status shows (not on the wire as such: each is, under its status key)."""
    steps_per_second: float | None = None
    """The job's rate (the median rank's for a distributed job; each rank's under ``ranks``)."""
    mfu: float | None = None
    peak_flops: float | None = None
    """The peak FLOP/s of one accelerator MFU divided by (``peak_basis`` says which)."""
    peak_basis: str | None = None
    """Which peak: the GPU table's figure for the job's matmul precision and MIG slice
    (``"H100 SXM bf16 dense"``, ``"... (precision unknown, assumed bf16)"``), or ``"declared"``."""
    arithmetic_intensity: float | None = None
    ridge_point: float | None = None
    iron_law: IronLaw | None = None
    rank_count: int | None = None
    """Ranks in the window (``ranks`` lists at most the worst few)."""
    ranks: list[RankFigures] | None = None
    """The worst few ranks (latest at the collectives first); only for jobs with several ranks."""

    @model_validator(mode="before")
    @classmethod
    def _shown_signals(cls, data: Any) -> Any:
        """The shown signals among the arguments (by field name or status key) go into ``shown``."""
        if not isinstance(data, Mapping):
            return data
        taken = {k: v for k, v in data.items() if k in _SHOWN}
        if not taken:
            return data
        if "shown" in data:
            raise ValueError("a shown signal goes either into shown or beside it, not both")
        rest = {k: v for k, v in data.items() if k not in _SHOWN}
        return {**rest, "shown": Observation(**taken)}

    @model_serializer(mode="wrap")
    def _flat(self, handler: SerializerFunctionWrapHandler, info: SerializationInfo) -> dict[str, Any]:
        derived: dict[str, Any] = handler(self)
        shown = signals.status_values(self.shown, by_alias=info.by_alias)
        if info.exclude_none:
            shown = {k: v for k, v in shown.items() if v is not None}
        return {**shown, **derived}

    @classmethod
    def status_keys(cls) -> tuple[str, ...]:
        """Every key ``status.metrics`` can hold: the shown signals' (table order), then the derived."""
        derived = [f.alias or n for n, f in cls.model_fields.items() if not f.exclude]
        return (*signals.STATUS_SIGNALS, *derived)

    if not TYPE_CHECKING:

        def __getattr__(self, name: str) -> Any:
            if name in _SHOWN_NAMES:  # metrics.data_wait_ratio: the shown signal
                return getattr(self.shown, name)
            return super().__getattr__(name)


_SHOWN_NAMES = frozenset(sig.name for sig in signals.STATUS_SIGNALS.values())
_SHOWN = _SHOWN_NAMES | frozenset(signals.STATUS_SIGNALS)
"""A shown signal's field names and status keys (``WindowMetrics`` takes either)."""


class _Recorded(_Wire):
    """A wire model whose ``evidence`` sentences are rendered from ``Evidence`` records it keeps
    (not on the wire): ``Bottleneck`` and ``Straggler``. No fields of its own (each subclass
    declares ``evidence`` where its wire order has it)."""

    if TYPE_CHECKING:
        evidence: list[str]

    _records: tuple[Evidence, ...] = PrivateAttr(default=())

    @classmethod
    def of(cls, records: Sequence[Evidence], **fields: Any) -> Self:
        """One whose ``evidence`` is rendered from ``records``, which it keeps (not on the wire)."""
        made = cls(evidence=[r.sentence for r in records], **fields)
        made._records = tuple(records)
        return made

    def with_records(self, records: Sequence[Evidence]) -> Self:
        """This one with ``evidence`` rendered from ``records``, which it keeps (not on the wire)."""
        copy = self.model_copy(update={"evidence": [r.sentence for r in records]})
        copy._records = tuple(records)
        return copy

    def records(self) -> list[Evidence]:
        """The record behind each evidence sentence: the engine's, where it made the sentence (the
        records survive ``model_copy``); a ``NOTE`` with no numbers for any other (read from a status)."""
        known = {r.sentence: r for r in self._records}
        return [known.get(s) or note(s) for s in self.evidence]

    def __eq__(self, other: object) -> bool:
        """Equal when the wire fields are: one read back from its status equals the verdict's."""
        if not isinstance(other, type(self)):
            return NotImplemented
        return self.__dict__ == other.__dict__

    __hash__ = None  # type: ignore[assignment]  # lists inside: never hashable


class Straggler(_Recorded):
    """``status.bottleneck.straggler``: the rank that holds a job back, and why."""

    pod: str | None = None
    """The pod in the cluster (None in local mode)."""
    rank: int | None = None
    """Its distributed rank (None for a pod without ranks: independent pods)."""
    cause: Axis
    evidence: list[str] = Field(default_factory=list)


class Bottleneck(_Recorded):
    """``status.bottleneck``: the verdict, a hypothesis with its evidence."""

    axis: Axis
    boundary: Axis | None = None
    regime: Regime
    lever: str
    lever_detail: str
    confidence: Ratio
    evidence: list[str] = Field(default_factory=list)
    avoid: list[str] = Field(default_factory=list)
    since: str | None = None
    missing: list[str] = Field(default_factory=list)
    straggler: Straggler | None = None


class Verdict(_Wire):
    model_config = _FLAT

    bottleneck: Bottleneck
    metrics: WindowMetrics

    def to_status(self) -> dict[str, Any]:
        """The status fields (``bottleneck``, ``metrics``) with camelCase names, Nones dropped."""
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")

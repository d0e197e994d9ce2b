"""Evidence as records: what a verdict's evidence line says (its kind and its numbers) beside the
sentence that says it in words. The kinds (``Kind``) are the leaf ``diagnosis.axes``, named here
too.

``status.bottleneck.evidence`` stays a list of sentences (docs/architecture.md); the engine builds
each one here, from its figures, as an ``Evidence`` record. Code that asks about evidence reads
the record, never the text: "is the throttling already said?" is ``finding.has(Kind.CPU_THROTTLED)``,
and "did only the window's sample size change?" is ``Evidence.identity`` (the sentence as it reads
without the sample size, rendered from the numbers, not cut out of the text).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from dam_operator.diagnosis.axes import Kind
from dam_operator.diagnosis.observation import Observation, Thresholds

GIB = float(1 << 30)


@dataclass(frozen=True)
class Evidence:
    """One evidence line: its kind, its sentence and the numbers the sentence states."""

    kind: Kind
    sentence: str
    numbers: Mapping[str, float] = field(default_factory=dict)
    steady: str | None = None
    """The sentence without the window's sample size ("(240 steps in 30 s)"), where it has one."""

    def because(self, reason: str) -> Evidence:
        """The same record with ``reason`` (": the loader is not the cause") said after it."""
        steady = None if self.steady is None else self.steady + reason
        return Evidence(self.kind, self.sentence + reason, self.numbers, steady)

    @property
    def identity(self) -> tuple[Kind, str]:
        """What the line finds, apart from how much evidence the window had: a window that ran
        33 s instead of 30 s (an operator under load) finds the same thing."""
        return (self.kind, self.sentence if self.steady is None else self.steady)


def note(sentence: str) -> Evidence:
    return Evidence(Kind.NOTE, sentence)


def pct(x: float) -> str:
    return f"{x:.1%}"


def thr(x: float) -> str:
    return f"{x:.0%}" if round(x * 100, 6) == round(x * 100) else f"{x:.1%}"


# --- the figures' sentences ----------------------------------------------------------------------

FigureText = Callable[[float, Observation, Thresholds], str]
"""A figure's sentence from its value, the observation and the thresholds."""
FigureLine = Callable[[Observation, Thresholds], Evidence]
"""A figure's evidence line from a window the rule has found the figure in."""


def _figure(kind: Kind, name: str, text: FigureText) -> FigureLine:
    """The evidence line of the observation's figure ``name`` (the rule has checked it is there):
    its sentence from ``text``, and the value under the field's name."""

    def line(o: Observation, t: Thresholds) -> Evidence:
        x: float | None = getattr(o, name)
        assert x is not None, name
        return Evidence(kind, text(x, o, t), {name: x})

    return line


def _loader_cpu_wait(x: float, o: Observation, t: Thresholds) -> str:
    workers = f"the {o.worker_count} loader workers" if o.worker_count else "the loader workers"
    return (
        f"{workers} waited for a CPU {pct(x)} of the window each "
        f"(run-queue delay; suspect ≥ {thr(t.cpu_wait_suspect)})"
    )


def _exposed_communication(x: float, o: Observation, t: Thresholds) -> str:
    who = "least-waiting rank" if (o.ranks or 0) > 1 else "not hidden by the backward pass"
    return f"exposed communication {pct(x)} of the step time ({who}; screen > {thr(t.communication_suspect)})"


def _container_memory(x: float, o: Observation, t: Thresholds) -> str:
    limit_bytes = o.container_memory_limit_bytes
    limit = f" of its {limit_bytes / GIB:.1f} GiB limit" if limit_bytes else " of its limit"
    return f"container memory at {pct(x)}{limit} (full ≥ {thr(t.container_memory_full)}; page cache included)"


data_wait = _figure(
    Kind.DATA_WAIT,
    "data_wait_ratio",
    lambda x, o, t: f"data wait {pct(x)} of step time (screen > {thr(t.data_wait_suspect)})",
)
gpu_utilization = _figure(
    Kind.GPU_UTILIZATION,
    "gpu_utilization",
    lambda x, o, t: (
        f"GPU utilization {pct(x)} (starved < {thr(t.gpu_util_starved)}, busy > {thr(t.gpu_util_busy)})"
    ),
)
sm_active = _figure(
    Kind.SM_ACTIVE, "sm_active", lambda x, o, t: f"SM active {pct(x)} (busy ≥ {thr(t.sm_active_busy)})"
)
dram_bandwidth = _figure(
    Kind.DRAM_BANDWIDTH,
    "dram_bandwidth_utilization",
    lambda x, o, t: f"DRAM bandwidth {pct(x)} of peak (saturated ≥ {thr(t.dram_bandwidth_saturated)})",
)
tensor_active = _figure(
    Kind.TENSOR_ACTIVE,
    "tensor_active",
    lambda x, o, t: f"tensor pipes active {pct(x)} (low < {thr(t.tensor_active_low)})",
)
main_cpu = _figure(
    Kind.MAIN_CPU,
    "main_cpu_cores",
    lambda x, o, t: (
        f"main training process uses {x:.2f} CPU cores (saturated ≥ {t.main_cpu_saturated_cores:.2f})"
    ),
)
cpu_throttled = _figure(
    Kind.CPU_THROTTLED,
    "cpu_throttled_ratio",
    lambda x, o, t: (
        f"container CPU-throttled {pct(x)} of the window (suspect > {thr(t.cpu_throttled_suspect)})"
    ),
)
cpu_wait = _figure(
    Kind.CPU_WAIT,
    "cpu_wait_ratio",
    lambda x, o, t: (
        f"the main training process waited for a CPU {pct(x)} of the window "
        f"(run-queue delay; suspect ≥ {thr(t.cpu_wait_suspect)})"
    ),
)
loader_cpu_wait = _figure(Kind.LOADER_CPU_WAIT, "worker_cpu_wait_ratio", _loader_cpu_wait)
exposed_communication = _figure(
    Kind.EXPOSED_COMMUNICATION, "exposed_communication_ratio", _exposed_communication
)
container_memory = _figure(Kind.CONTAINER_MEMORY, "container_memory_ratio", _container_memory)


def resident_memory(o: Observation) -> Evidence | None:
    parts: list[str] = []
    numbers: dict[str, float] = {}
    if o.worker_rss_bytes is not None:
        workers = f"{o.worker_count} loader workers" if o.worker_count else "loader workers"
        parts.append(f"{workers} {o.worker_rss_bytes / GIB:.2f} GiB")
        numbers["worker_rss_bytes"] = o.worker_rss_bytes
    if o.main_rss_bytes is not None:
        parts.append(f"main process {o.main_rss_bytes / GIB:.2f} GiB")
        numbers["main_rss_bytes"] = o.main_rss_bytes
    if not parts:
        return None
    return Evidence(Kind.RESIDENT_MEMORY, "resident memory: " + ", ".join(parts), numbers)


def mfu(value: float, t: Thresholds) -> Evidence:
    """The MFU line every verdict carries (``efficient`` / ``investigate`` past the thresholds)."""
    label = "efficient" if value > t.mfu_efficient else ("investigate" if value < t.mfu_investigate else "")
    return Evidence(Kind.MFU, f"MFU {pct(value)}" + (f" ({label})" if label else ""), {"mfu": value})


def rate(
    steps_per_second: float, steps: float | None, window_seconds: float | None, *, each_rank: bool
) -> Evidence:
    """``5.00 steps/s (300 steps in 60 s), each rank``: the rate and the sample it is measured on."""
    rate_text = f"{steps_per_second:.2f} steps/s"
    tail = ", each rank" if each_rank else ""
    numbers = {"steps_per_second": steps_per_second}
    sample = ""
    if steps is not None and window_seconds is not None:
        sample = f" ({steps:.0f} steps in {window_seconds:.0f} s)"
        numbers |= {"steps": steps, "window_seconds": window_seconds}
    return Evidence(Kind.RATE, rate_text + sample + tail, numbers, steady=rate_text + tail)

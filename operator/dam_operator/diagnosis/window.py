"""From two metric snapshots to one ``Observation``; from many pods to one; and stragglers.

Counters (``*_total``) are differences between the two snapshots. A counter that went
down was reset (a restarted process): like Prometheus, the AFTER value is taken as the
increase. A series absent from BEFORE is counted from zero. Gauges are read from
AFTER and averaged across GPUs (label ``gpu``); when ``gpu_uuids`` is given, samples
with a ``uuid`` label outside the set are ignored (other tenants' GPUs).

The window length is, in order: ``elapsed_seconds`` when given, the difference of
``dam_snapshot_timestamp_seconds``, the snapshots' own timestamps, and finally the
step-seconds counter's increase.

Garbage (NaN, infinities, negative values, ratios well above 1) never raises: the
signal is dropped and the engine sees it as missing.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from pydantic import ValidationError

from dam_operator.diagnosis.model import Observation
from dam_sidecar import names
from dam_sidecar.promtext import Labels, Sample, Snapshot

_RATIO_TOLERANCE = 1.05
"""Ratios up to this are clamped to 1 (sampling jitter); above it they are garbage."""

GPU_RATIO_GAUGES: Mapping[str, str] = {
    "gpu_utilization": names.GPU_UTILIZATION_RATIO,
    "gpu_memory_busy": names.GPU_MEMORY_BUSY_RATIO,
    "sm_active": names.GPU_SM_ACTIVE_RATIO,
    "sm_occupancy": names.GPU_SM_OCCUPANCY_RATIO,
    "tensor_active": names.GPU_TENSOR_ACTIVE_RATIO,
    "dram_bandwidth_utilization": names.GPU_DRAM_BANDWIDTH_UTILIZATION_RATIO,
}


def _valid(v: float | None) -> float | None:
    if v is None or not math.isfinite(v) or v < 0:
        return None
    return v


def _ratio(v: float | None) -> float | None:
    v = _valid(v)
    if v is None or v > _RATIO_TOLERANCE:
        return None
    return min(v, 1.0)


def _label(labels: Labels, key: str) -> str | None:
    for k, v in labels:
        if k == key:
            return v
    return None


def counter_increase(
    before: Snapshot, after: Snapshot, name: str, where: Callable[[Labels], bool] | None = None
) -> float | None:
    """Sum over series of the counter's increase; None when AFTER has no valid series."""
    prev = before.series(name)
    total: float | None = None
    for labels, value in after.series(name).items():
        if where is not None and not where(labels):
            continue
        a = _valid(value)
        if a is None:
            continue
        b = _valid(prev.get(labels))
        delta = a if b is None or a < b else a - b
        total = delta if total is None else total + delta
    return total


def _gauge(snapshot: Snapshot, name: str) -> float | None:
    for s in snapshot.samples(name):
        v = _valid(s.value)
        if v is not None:
            return v
    return None


def _attribution_state(snapshot: Snapshot) -> str | None:
    """The ``state`` label of ``dam_gpu_attribution`` whose value is 1 (None when absent)."""
    for s in snapshot.samples(names.GPU_ATTRIBUTION):
        if s.value == 1.0:
            return s.label("state") or None
    return None


def _attributed(sample: Sample, gpu_uuids: set[str] | None) -> bool:
    if gpu_uuids is None:
        return True
    uuid = sample.label("uuid")
    return not uuid or uuid in gpu_uuids


def _gpu_key(sample: Sample) -> str:
    return sample.label("uuid") or sample.label("gpu") or ""


def _build(fields: dict[str, Any]) -> Observation:
    """An Observation from the fields that validate; a field that does not is dropped."""
    data = {k: v for k, v in fields.items() if v is not None}
    for _ in range(len(data) + 1):
        try:
            return Observation(**data)
        except ValidationError as exc:
            bad = {str(err["loc"][0]) for err in exc.errors() if err.get("loc")}
            if not bad & set(data):
                break
            for key in bad:
                data.pop(key, None)
    return Observation()


def observation_from_snapshots(
    before: Snapshot,
    after: Snapshot,
    *,
    elapsed_seconds: float | None = None,
    gpu_uuids: set[str] | None = None,
    batch_size: int | None = None,
    flops_per_step: float | None = None,
    gpu_model: str | None = None,
) -> Observation:
    """The window between two scrapes of one pod (or one ``dam run``). Explicit arguments win."""
    step_s = counter_increase(before, after, names.STEP_SECONDS_TOTAL)
    wait_s = counter_increase(before, after, names.DATALOADER_WAIT_SECONDS_TOTAL)
    steps = counter_increase(before, after, names.STEPS_TOTAL)

    elapsed = _valid(elapsed_seconds) or None
    if elapsed is None:
        t0 = _gauge(before, names.SNAPSHOT_TIMESTAMP_SECONDS)
        t1 = _gauge(after, names.SNAPSHOT_TIMESTAMP_SECONDS)
        if t0 is not None and t1 is not None and t1 > t0:
            elapsed = t1 - t0
    if elapsed is None:
        t0, t1 = _valid(before.timestamp_seconds), _valid(after.timestamp_seconds)
        if t0 is not None and t1 is not None and t1 > t0:
            elapsed = t1 - t0
    if elapsed is None and step_s:
        elapsed = step_s

    fields: dict[str, Any] = {"window_seconds": elapsed, "steps": steps}
    if steps is not None and elapsed:
        fields["steps_per_second"] = steps / elapsed
    if steps and step_s is not None:
        fields["mean_step_seconds"] = step_s / steps
    if wait_s is not None and step_s:
        fields["data_wait_ratio"] = _ratio(wait_s / step_s)

    # GPUs: gauges from AFTER, averaged over the attributed GPUs.
    gpu_keys: set[str] = set()
    for field_name, metric in GPU_RATIO_GAUGES.items():
        values = []
        for s in after.samples(metric):
            if not _attributed(s, gpu_uuids):
                continue
            v = _ratio(s.value)
            if v is not None:
                values.append(v)
                gpu_keys.add(_gpu_key(s))
        if values:
            fields[field_name] = statistics.fmean(values)
    if gpu_keys:
        fields["gpu_count"] = len(gpu_keys)
    elif _gauge(after, names.NVML_UP) == 1.0 and _attribution_state(after) != "none":
        # NVML answers, the sidecar knows which GPUs are the job's, and none is: a CPU-only job.
        # With attribution "none" the job's GPUs are unknown, not absent: gpu_count stays None.
        fields["gpu_count"] = 0

    # Host CPU.
    if elapsed:
        for field_name, role in (
            ("main_cpu_cores", names.ROLE_MAIN),
            ("worker_cpu_cores", names.ROLE_WORKER),
        ):
            cpu = counter_increase(
                before,
                after,
                names.PROCESS_CPU_SECONDS_TOTAL,
                lambda labels, r=role: _label(labels, "role") == r,  # type: ignore[misc]
            )
            if cpu is not None:
                fields[field_name] = cpu / elapsed
        throttled = counter_increase(before, after, names.CONTAINER_CPU_THROTTLED_SECONDS_TOTAL)
        if throttled is not None:
            fields["cpu_throttled_ratio"] = min(1.0, throttled / elapsed)
    limit = _gauge(after, names.CONTAINER_CPU_LIMIT_CORES)
    if limit:
        fields["cpu_limit_cores"] = limit
    for s in after.samples(names.PROCESSES):
        count = _valid(s.value)
        if _label(s.labels, "role") == names.ROLE_WORKER and count is not None and count <= 100_000:
            fields["worker_count"] = round(count)
    node = _gauge(after, names.NODE_CPU_UTILIZATION_RATIO)
    if node is not None:
        fields["node_cpu_utilization"] = _ratio(node)

    # Workload description.
    if batch_size is None:
        sizes = [v for s in after.samples(names.BATCH_SIZE) if (v := _valid(s.value)) is not None]
        if sizes and max(sizes) <= 1e9:
            batch_size = round(max(sizes))
    fields["batch_size"] = batch_size
    if flops_per_step is None:
        flops = [v for s in after.samples(names.MODEL_FLOPS_PER_STEP) if (v := _valid(s.value)) is not None]
        if flops:
            flops_per_step = statistics.fmean(flops)
    fields["flops_per_step"] = flops_per_step
    if gpu_model is None:
        for s in after.samples(names.GPU_INFO):
            model = s.label("model") or s.label("name")
            if model and _attributed(s, gpu_uuids):
                gpu_model = model[:64]
                break
    fields["gpu_model"] = gpu_model
    return _build(fields)


# --- many pods ----------------------------------------------------------------------


def _known(values: Iterable[float | int | None]) -> list[float]:
    return [float(v) for v in values if v is not None]


def _sum(values: Iterable[float | int | None]) -> float | None:
    known = _known(values)
    return math.fsum(known) if known else None


def _weighted(pairs: Iterable[tuple[float | None, float]]) -> float | None:
    known = [(v, w) for v, w in pairs if v is not None and w > 0]
    total = math.fsum(w for _, w in known)
    if not known or total <= 0:
        return None
    return math.fsum(v * w for v, w in known) / total


def _common(values: Iterable[Any]) -> Any:
    known = {v for v in values if v is not None}
    return known.pop() if len(known) == 1 else None


def aggregate(per_pod: Mapping[str, Observation]) -> Observation:
    """One observation for a job from its pods' observations.

    Counts and rates (steps, steps/s, CPU cores, CPU limits, GPUs) are summed; the data
    wait ratio is weighted by each pod's step time; GPU ratios by its GPU count; the
    throttled ratio and the window are the mean and the longest. Batch size and GPU model
    are kept only when every pod agrees.
    """
    pods = list(per_pod.values())
    if not pods:
        return Observation()
    if len(pods) == 1:
        return pods[0]

    def step_weight(o: Observation) -> float:
        if o.steps is not None and o.mean_step_seconds is not None:
            return o.steps * o.mean_step_seconds
        return 0.0

    use_step_time = all(step_weight(o) > 0 for o in pods)
    use_steps = all(o.steps for o in pods)
    wait_weights = [
        step_weight(o) if use_step_time else (float(o.steps or 0) if use_steps else 1.0) for o in pods
    ]
    gpu_weights = [float(o.gpu_count) if o.gpu_count else 1.0 for o in pods]
    steps_weights = [float(o.steps) if o.steps else 1.0 for o in pods]

    fields: dict[str, Any] = {
        "window_seconds": max(_known(o.window_seconds for o in pods), default=None),
        "steps": _sum(o.steps for o in pods),
        "steps_per_second": _sum(o.steps_per_second for o in pods),
        "data_wait_ratio": _weighted((o.data_wait_ratio, w) for o, w in zip(pods, wait_weights, strict=True)),
        "mean_step_seconds": _weighted(
            (o.mean_step_seconds, w) for o, w in zip(pods, steps_weights, strict=True)
        ),
        "main_cpu_cores": _sum(o.main_cpu_cores for o in pods),
        "worker_cpu_cores": _sum(o.worker_cpu_cores for o in pods),
        "cpu_limit_cores": _sum(o.cpu_limit_cores for o in pods),
        "cpu_throttled_ratio": _weighted((o.cpu_throttled_ratio, 1.0) for o in pods),
        "node_cpu_utilization": _weighted((o.node_cpu_utilization, 1.0) for o in pods),
        "batch_size": _common(o.batch_size for o in pods),
        "flops_per_step": _weighted((o.flops_per_step, w) for o, w in zip(pods, steps_weights, strict=True)),
        "bytes_per_step": _weighted((o.bytes_per_step, w) for o, w in zip(pods, steps_weights, strict=True)),
        "gpu_model": _common(o.gpu_model for o in pods),
    }
    counts = _known(o.gpu_count for o in pods)
    fields["gpu_count"] = round(math.fsum(counts)) if counts else None
    workers = _known(o.worker_count for o in pods)
    fields["worker_count"] = round(math.fsum(workers)) if workers else None
    for name in GPU_RATIO_GAUGES:
        fields[name] = _weighted((getattr(o, name), w) for o, w in zip(pods, gpu_weights, strict=True))
    for name in ("data_wait_ratio", "cpu_throttled_ratio", "node_cpu_utilization", *GPU_RATIO_GAUGES):
        if fields[name] is not None:
            fields[name] = min(1.0, max(0.0, fields[name]))
    return _build(fields)


STRAGGLER_RATE_RATIO = 0.75
"""A pod slower than this fraction of the other pods' median step rate is a straggler."""
STRAGGLER_WAIT_GAP = 0.10
"""A pod waiting for data this much more (absolute) than the others, and twice as much, is a straggler."""


def find_straggler(per_pod: Mapping[str, Observation]) -> tuple[str, str] | None:
    """The pod that holds the others back, with a sentence saying why; None when no pod stands out."""
    if len(per_pod) < 2:
        return None
    worst: tuple[float, str, str] | None = None
    for pod in sorted(per_pod):
        obs = per_pod[pod]
        others = [o for name, o in per_pod.items() if name != pod]
        n = len(others)
        plural = "pod" if n == 1 else f"{n} pods"
        rates = _known(o.steps_per_second for o in others)
        if obs.steps_per_second is not None and rates:
            median = statistics.median(rates)
            if median > 0 and obs.steps_per_second < STRAGGLER_RATE_RATIO * median:
                score = 1.0 - obs.steps_per_second / median
                text = (
                    f"pod {pod} runs {obs.steps_per_second:.2f} steps/s vs a median of {median:.2f} steps/s "
                    f"for the other {plural}"
                )
                if worst is None or score > worst[0]:
                    worst = (score, pod, text)
        waits = _known(o.data_wait_ratio for o in others)
        if obs.data_wait_ratio is not None and waits:
            median_wait = statistics.median(waits)
            gap = obs.data_wait_ratio - median_wait
            if gap >= STRAGGLER_WAIT_GAP and obs.data_wait_ratio >= 2 * median_wait:
                text = (
                    f"pod {pod} waits for data {obs.data_wait_ratio:.1%} of its step time vs a median of "
                    f"{median_wait:.1%} for the other {plural}"
                )
                if worst is None or gap > worst[0]:
                    worst = (gap, pod, text)
    return (worst[1], worst[2]) if worst else None

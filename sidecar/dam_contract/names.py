"""The metrics the sidecar exports, each declared once: name, type, HELP, labels, source, sample field.

This module is the contract of docs/architecture.md (metric names) in one place. The sidecar's
collectors build their families from these declarations (``dam_sidecar.collectors``), the operator
and ``dam evaluate`` read the names, ``tools/gen_metrics_doc.py`` writes docs/metrics.md from
``CATALOG``, and the Grafana dashboard and the alert rules query them. Nothing else in the code
base spells a ``dam_`` metric name or its HELP text by hand.

Each ``NAME: Final = _metric(...)`` is one declaration: it appends a ``MetricSpec`` to ``CATALOG``
(in this order) and binds the plain name. Why the declarations live here, as plain ``str``
constants:

- ``dam_contract`` is the layer both sides stand on (import-linter: ``dam_operator`` ->
  ``dam_sidecar`` -> ``dam_probe`` -> ``dam_contract``, standard library only), so the sidecar's
  collectors, the operator's signal table and the doc tool read one table without the operator
  importing the sidecar;
- the constants stay exact ``str`` with the same values: the operator compares them, keys dicts
  and writes YAML/JSON with them (~50 imports), and none of that notices the table behind them.
  ``BY_NAME[name]`` gives the rest of a name's declaration. (A ``str`` subclass carrying the
  fields would have put non-``str`` names into samples, dict keys and YAML; a second module of
  specs would have made every new metric two edits again.)

``sample`` says where a collector reads the value of a plain field->family metric, as an
attribute path of the sample that collector holds (a ``GpuSample`` for ``nvml`` and ``gpm``: e.g.
``power_watts``, ``gpm.sm_active``, a key of its ``gpm`` dict; the host collector's
``HostReading`` for ``cpu`` and ``memory``: e.g. ``cpu.node_utilization_ratio``), or as
``(label value, path)`` pairs for a family whose last label tells fields apart (``direction`` tx
and rx). A ``None`` value leaves the series out. ``sample=""`` marks a family its collector builds
by hand (per role, per rank, a state set, ...). A collector yields the derived families of a
source in declaration order (the host collector: the ``cpu`` counters, then the CPU source, then
the ``cpu`` gauges), so the order here is the order of /metrics
(tests/unit/sidecar/test_exposition_golden.py pins the text) and of docs/metrics.md.

A new figure from a source the sidecar already reads is its field in the sampler plus one
declaration here (docs/CONTRIBUTING.md, "Add a signal"). A figure the probe sums over a rank's
processes is a row of the probe's field table marked ``summed`` (``dam_probe.layout``) and one
declaration here with ``sample="totals.<key>"``: the sampler and the collector need no edit.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final, Literal

Kind = Literal["counter", "gauge"]
# The docs/metrics.md section a metric is listed in, and for nvml/gpm/cpu/memory its collector.
Source = Literal["probe", "nvml", "gpm", "cpu", "memory", "sidecar"]
# An attribute path, or (label value, attribute path) pairs for the family's last label.
SampleField = str | tuple[tuple[str, str], ...]
COUNTER: Final = "counter"
GAUGE: Final = "gauge"


@dataclass(frozen=True)
class MetricSpec:
    """One exported metric: what /metrics writes in its HELP and TYPE lines, and where it is read."""

    name: str
    kind: Kind
    help: str
    labels: tuple[str, ...] = ()
    source: Source | Literal[""] = ""
    sample: SampleField = ""


_DECLARED: list[MetricSpec] = []


def _metric(
    name: str, kind: Kind, help: str, labels: tuple[str, ...], source: Source, *, sample: SampleField = ""
) -> str:
    """Declare one metric (appended to ``CATALOG`` in declaration order); returns its name."""
    if any(m.name == name for m in _DECLARED):
        raise ValueError(f"{name} is declared twice")
    _DECLARED.append(MetricSpec(name, kind, help, labels, source, sample))
    return name


# --- label names and values (bounded by construction) -----------------------
ROLE_LABEL: Final = "role"
ROLE_MAIN: Final = "main"
ROLE_WORKER: Final = "worker"
# Where the container CPU throttling and limit come from (dam_container_cpu_source{source}).
CPU_SOURCE_CGROUP: Final = "cgroup"  # the sidecar read the training container's cgroup itself
CPU_SOURCE_PROBE: Final = "probe"  # the probe read its own cgroup from inside the training container
CPU_SOURCE_NONE: Final = "none"
CPU_SOURCES: Final = (CPU_SOURCE_CGROUP, CPU_SOURCE_PROBE, CPU_SOURCE_NONE)
# The same three sources for the container memory figures (dam_container_memory_source{source}).
MEMORY_SOURCES: Final = CPU_SOURCES
# dam_badput_seconds_total{cause}: the process's causes (``restart`` is the operator's).
CAUSE_LABEL: Final = "cause"
CAUSE_STARTUP: Final = "startup"
CAUSE_DATA_WAIT: Final = "data-wait"
CAUSE_COMMUNICATION: Final = "communication"
CAUSE_CHECKPOINT: Final = "checkpoint"
CAUSE_OTHER: Final = "other"
CAUSE_RESTART: Final = "restart"
BADPUT_CAUSES: Final = (CAUSE_STARTUP, CAUSE_DATA_WAIT, CAUSE_COMMUNICATION, CAUSE_CHECKPOINT, CAUSE_OTHER)
# dam_model_flops_per_step{source}: declared by the job, or measured once by the probe.
SOURCE_LABEL: Final = "source"
FLOPS_DECLARED: Final = "declared"
FLOPS_MEASURED: Final = "measured"
# dam_model_flops_unavailable{reason,detail}: why the probe did not count a step's FLOPs.
REASON_LABEL: Final = "reason"
DETAIL_LABEL: Final = "detail"
FLOPS_UNAVAILABLE_REASONS: Final = (
    "off",  # DAM_PROBE_FLOPS=0
    "no-torch",  # torch never loaded in the process
    "compiled",  # torch.compile ran: the counter sees no op of a compiled region
    "low-memory",  # the container's memory limit leaves under 512 MiB free
    "counter-error",  # the counter raised (an op's FLOP formula: detail names the op, the error)
    "higher-order-op",  # a higher-order op ran (detail): it runs uncounted
    "no-formula",  # no op of the step has a FLOP formula (custom kernels only)
    "cut-short",  # the loader ran out while counting, three times
    "mode-stack",  # the step left a dispatch mode of its own open above the counter's
)
"""By the probe's ``FLOPS_REASON_*`` code (dam_probe.layout): code ``i`` is entry ``i - 1``."""
# dam_model_flops_precision{precision}: the precision the counted step's matmul FLOPs ran in.
PRECISION_LABEL: Final = "precision"
PRECISIONS: Final = ("fp32", "tf32", "fp16", "bf16", "fp8", "fp64")
"""By the probe's ``PRECISION_*`` code (dam_probe.layout): code ``i`` is entry ``i - 1``."""
# Labels of the per-rank and interconnect series.
RANK_LABEL: Final = "rank"
DIRECTION_LABEL: Final = "direction"
DIRECTION_TX: Final = "tx"
DIRECTION_RX: Final = "rx"
GPU_LABELS: Final = ("gpu", "uuid")  # the NVML index and the UUID of every GPU series
RANK_LABELS: Final = (RANK_LABEL,)  # present only when the training process has a distributed rank

# --- training loop (from the in-process probe) -----------------------------
STEPS_TOTAL: Final = _metric(
    "dam_steps_total",
    COUNTER,
    "Steps (batches consumed), summed over training processes.",
    RANK_LABELS,
    "probe",
    sample="totals.steps",
)
DATALOADER_WAIT_SECONDS_TOTAL: Final = _metric(
    "dam_dataloader_wait_seconds_total",
    COUNTER,
    "Time the training loop blocked waiting for the next batch, summed over training processes.",
    RANK_LABELS,
    "probe",
    sample="totals.wait_seconds",
)
STEP_SECONDS_TOTAL: Final = _metric(
    "dam_step_seconds_total",
    COUNTER,
    "Wall time covered by steps (between successive batch fetches), summed over training processes.",
    RANK_LABELS,
    "probe",
    sample="totals.step_seconds",
)
PROBE_UP: Final = _metric(
    "dam_probe_up", GAUGE, "1 while at least one in-process probe is live, else 0.", (), "probe"
)
PROBE_PROCESSES: Final = _metric(
    "dam_probe_processes", GAUGE, "Training processes with a live probe file.", (), "probe"
)
BATCH_SIZE: Final = _metric(
    "dam_batch_size", GAUGE, "Batch size of the latest batch (absent when unknown).", (), "probe"
)
MODEL_FLOPS_PER_STEP: Final = _metric(
    "dam_model_flops_per_step",
    GAUGE,
    "FLOPs of one training step: declared by the training script (source=declared), else "
    "counted once by the probe with torch's FLOP formulas after warm-up (source=measured); "
    "absent when unknown (label rank when the process has one).",
    (RANK_LABEL, SOURCE_LABEL),
    "probe",
)
MODEL_FLOPS_UNAVAILABLE: Final = _metric(
    "dam_model_flops_unavailable",
    GAUGE,
    "1 for a process whose probe does not count its step's FLOPs, by reason (off, no-torch, "
    "compiled, low-memory, counter-error, higher-order-op, no-formula, cut-short, mode-stack) and "
    "detail (the op and the error, for counter-error and higher-order-op); absent when the FLOPs "
    "per step are known or still to be counted (label rank when the process has one).",
    (RANK_LABEL, REASON_LABEL, DETAIL_LABEL),
    "probe",
)
MODEL_FLOPS_PRECISION: Final = _metric(
    "dam_model_flops_precision",
    GAUGE,
    "1 for a process whose probe counted its step's FLOPs, by the precision most of them ran in "
    "(fp32, tf32, fp16, bf16, fp8, fp64: the matmul-class ops' dtype; fp32 on CUDA with TF32 "
    "allowed is tf32); absent when unknown (label rank when the process has one).",
    (RANK_LABEL, PRECISION_LABEL),
    "probe",
)
GOODPUT_SECONDS_TOTAL: Final = _metric(
    "dam_goodput_seconds_total",
    COUNTER,
    "Productive step time since the process started: step time less data wait, exposed "
    "communication and checkpoint saves (label rank when the process has one).",
    RANK_LABELS,
    "probe",
)
BADPUT_SECONDS_TOTAL: Final = _metric(
    "dam_badput_seconds_total",
    COUNTER,
    "Time lost since the process started, by cause: startup (process start to the first "
    "batch), data-wait, communication (exposed), checkpoint (blocked in torch.save, "
    "torch.distributed.checkpoint and safetensors saves), other (the rest of the elapsed time); "
    "goodput plus badput is the elapsed time; a cause the probe cannot measure in the process "
    "(its collectives or saves not timed) is absent (label rank when the process has one).",
    (CAUSE_LABEL, RANK_LABEL),
    "probe",
)
CHECKPOINTS_TOTAL: Final = _metric(
    "dam_checkpoints_total",
    COUNTER,
    "Checkpoint saves the training thread blocked in (label rank when the process has one).",
    RANK_LABELS,
    "probe",
)
LAST_CHECKPOINT_TIMESTAMP_SECONDS: Final = _metric(
    "dam_last_checkpoint_timestamp_seconds",
    GAUGE,
    "Unix time the latest checkpoint save (torch.save, torch.distributed.checkpoint) of the "
    "rank ended, kept after its process ended; absent until a save was seen (label rank when "
    "the process has one).",
    RANK_LABELS,
    "probe",
)
STEPS_SINCE_CHECKPOINT: Final = _metric(
    "dam_steps_since_checkpoint",
    GAUGE,
    "Steps the live processes took since their latest checkpoint save, every step of a "
    "process that saved none yet: the progress a restart would redo; absent while no live "
    "process times its saves (label rank when the process has one).",
    RANK_LABELS,
    "probe",
)
PROCESS_RESTARTS_TOTAL: Final = _metric(
    "dam_process_restarts_total",
    COUNTER,
    "Training processes that took a rank after a process of that rank ended, inside the "
    "container (torchrun --max-restarts, a retry loop): restarts the kubelet does not see "
    "(label rank; processes without a rank are never counted).",
    RANK_LABELS,
    "probe",
)
PROCESS_RESTART_GAP_SECONDS_TOTAL: Final = _metric(
    "dam_process_restart_gap_seconds_total",
    COUNTER,
    "Time from each ended process's last publish to the start of the process that took its "
    "rank inside the container: the down time of those restarts (label rank).",
    RANK_LABELS,
    "probe",
)
COLLECTIVES_TOTAL: Final = _metric(
    "dam_collectives_total",
    COUNTER,
    "Collectives completed (explicit torch.distributed calls and DDP gradient buckets).",
    RANK_LABELS,
    "probe",
    sample="totals.collectives",
)
COLLECTIVE_SECONDS_TOTAL: Final = _metric(
    "dam_collective_seconds_total",
    COUNTER,
    "Time in torch.distributed collectives and DDP gradient buckets, launch to completion, "
    "including the wait for peers (label rank when the process has one).",
    RANK_LABELS,
    "probe",
    sample="totals.collective_seconds",
)
COLLECTIVE_EXPOSED_SECONDS_TOTAL: Final = _metric(
    "dam_collective_exposed_seconds_total",
    COUNTER,
    "Communication the training thread waited for: with DDP, from the hand-over of the last "
    "gradient bucket to the completion of the step's last bucket; synchronous collectives "
    "whole (label rank when the process has one).",
    RANK_LABELS,
    "probe",
    sample="totals.collective_exposed_seconds",
)
COLLECTIVE_BYTES_TOTAL: Final = _metric(
    "dam_collective_bytes_total",
    COUNTER,
    "Bytes this process contributed to collectives (input tensor sizes).",
    RANK_LABELS,
    "probe",
    sample="totals.collective_bytes",
)
PROCESS_RANK_INFO: Final = _metric(
    "dam_process_rank_info",
    GAUGE,
    "1 per live training process with a distributed rank; local_rank and world_size are empty when unknown.",
    (RANK_LABEL, "local_rank", "world_size"),
    "probe",
)

LAST_BATCH_TIMESTAMP_SECONDS: Final = _metric(
    "dam_last_batch_timestamp_seconds",
    GAUGE,
    "Unix time the rank's training loop took its latest batch, kept after its process ended; "
    "absent before the first batch (label rank when the process has one).",
    RANK_LABELS,
    "probe",
)
COLLECTIVE_SEQUENCE: Final = _metric(
    "dam_collective_sequence",
    GAUGE,
    "Timed collectives the live process's training thread entered: the sequence number of the "
    "latest, which lines ranks up at a stall (label rank when the process has one).",
    RANK_LABELS,
    "probe",
)
RANK_UP: Final = _metric(
    "dam_rank_up",
    GAUGE,
    "1 while a process of the rank is live, 0 once every process of the rank ended (a rank "
    "that died while the pod runs reads 0) (label rank when the process has one).",
    RANK_LABELS,
    "probe",
)
TRAINING_PLACE_INFO: Final = _metric(
    "dam_training_place_info",
    GAUGE,
    "1 while the rank's step is overdue: where the probe's watchdog found the training thread "
    "(where = collective, dataloader, checkpoint, backward, optimizer, user-code), the detail "
    "(all_reduce #12, worker 1 pid 77 dead) and its innermost frames (file:line function, one a "
    "line); absent while steps come (label rank when the process has one).",
    (RANK_LABEL, "where", DETAIL_LABEL, "frames"),
    "probe",
)
DATALOADER_NUM_WORKERS: Final = _metric(
    "dam_dataloader_num_workers",
    GAUGE,
    "num_workers of the DataLoader the live process iterated last, as the loader has it after "
    "any override (DAM_LOADER_OVERRIDES): the setting, not the worker processes alive, which "
    "are none between epochs without persistent_workers (label rank when the process has one).",
    RANK_LABELS,
    "probe",
)
DATALOADER_PREFETCH_FACTOR: Final = _metric(
    "dam_dataloader_prefetch_factor",
    GAUGE,
    "prefetch_factor of that DataLoader; absent without workers (torch's None) or when unknown "
    "(label rank when the process has one).",
    RANK_LABELS,
    "probe",
)
DATALOADER_PIN_MEMORY: Final = _metric(
    "dam_dataloader_pin_memory",
    GAUGE,
    "1 when that DataLoader pins its batches (pin_memory set and an accelerator to pin for), "
    "0 when not; absent when unknown (label rank when the process has one).",
    RANK_LABELS,
    "probe",
)
DATALOADER_PERSISTENT_WORKERS: Final = _metric(
    "dam_dataloader_persistent_workers",
    GAUGE,
    "1 when that DataLoader keeps its workers across epochs (persistent_workers), 0 when not; "
    "absent when unknown (label rank when the process has one).",
    RANK_LABELS,
    "probe",
)

# --- accelerator (NVML), in the GPU collector's order ----------------------
NVML_UP: Final = _metric(
    "dam_nvml_up",
    GAUGE,
    "1 when NVML answered the latest sample, 0 when absent, failing or stuck.",
    (),
    "nvml",
)
GPU_ATTRIBUTION: Final = _metric(
    "dam_gpu_attribution",
    GAUGE,
    "How the reported GPUs were attributed to the job: 1 for the current state (probe, "
    "visible_devices, all, none).",
    ("state",),
    "nvml",
)
GPU_INFO: Final = _metric(
    "dam_gpu_info", GAUGE, "1 per reported GPU, with its model name.", (*GPU_LABELS, "name"), "nvml"
)
GPU_UTILIZATION_RATIO: Final = _metric(
    "dam_gpu_utilization_ratio",
    GAUGE,
    "NVML utilization.gpu: time a kernel was resident.",
    GPU_LABELS,
    "nvml",
    sample="utilization_ratio",
)
GPU_MEMORY_BUSY_RATIO: Final = _metric(
    "dam_gpu_memory_busy_ratio",
    GAUGE,
    "NVML utilization.memory: time device memory was read or written.",
    GPU_LABELS,
    "nvml",
    sample="memory_busy_ratio",
)
GPU_MEMORY_USED_BYTES: Final = _metric(
    "dam_gpu_memory_used_bytes",
    GAUGE,
    "Device memory in use.",
    GPU_LABELS,
    "nvml",
    sample="memory_used_bytes",
)
GPU_MEMORY_TOTAL_BYTES: Final = _metric(
    "dam_gpu_memory_total_bytes",
    GAUGE,
    "Device memory installed.",
    GPU_LABELS,
    "nvml",
    sample="memory_total_bytes",
)
GPU_POWER_WATTS: Final = _metric(
    "dam_gpu_power_watts", GAUGE, "Board power draw.", GPU_LABELS, "nvml", sample="power_watts"
)
GPU_SM_CLOCK_HERTZ: Final = _metric(
    "dam_gpu_sm_clock_hertz", GAUGE, "Current SM clock.", GPU_LABELS, "nvml", sample="sm_clock_hertz"
)
GPU_TEMPERATURE_CELSIUS: Final = _metric(
    "dam_gpu_temperature_celsius",
    GAUGE,
    "GPU die temperature.",
    GPU_LABELS,
    "nvml",
    sample="temperature_celsius",
)
GPU_THROTTLE_REASON: Final = _metric(
    "dam_gpu_clock_throttle_reason",
    GAUGE,
    "1 when the clock is held down for this reason (NVML clock event reasons), else 0.",
    (*GPU_LABELS, "reason"),
    "nvml",
)
GPU_PCIE_TX_BYTES_PER_SECOND: Final = _metric(
    "dam_gpu_pcie_tx_bytes_per_second",
    GAUGE,
    "PCIe transmit throughput.",
    GPU_LABELS,
    "nvml",
    sample="pcie_tx_bytes_per_second",
)
GPU_PCIE_RX_BYTES_PER_SECOND: Final = _metric(
    "dam_gpu_pcie_rx_bytes_per_second",
    GAUGE,
    "PCIe receive throughput.",
    GPU_LABELS,
    "nvml",
    sample="pcie_rx_bytes_per_second",
)
GPU_PCIE_BYTES_TOTAL: Final = _metric(
    "dam_gpu_pcie_bytes_total",
    COUNTER,
    "PCIe traffic (direction tx/rx), integrated from the throughput NVML samples each interval.",
    (*GPU_LABELS, DIRECTION_LABEL),
    "nvml",
    sample=((DIRECTION_TX, "pcie_tx_bytes"), (DIRECTION_RX, "pcie_rx_bytes")),
)
GPU_NVLINK_BYTES_TOTAL: Final = _metric(
    "dam_gpu_nvlink_bytes_total",
    COUNTER,
    "NVLink data traffic over all links (direction tx/rx), from NVML field values "
    "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX/RX; absent without NVLink.",
    (*GPU_LABELS, DIRECTION_LABEL),
    "nvml",
    sample=((DIRECTION_TX, "nvlink_tx_bytes"), (DIRECTION_RX, "nvlink_rx_bytes")),
)
GPU_SLICE_RATIO: Final = _metric(
    "dam_gpu_slice_ratio",
    GAUGE,
    "The share of its physical GPU a device is: 1 for a whole GPU (MIG mode off), a MIG device's "
    "GPU-instance slices over the most the GPU has (3/7 for a 3g slice of an A100 or H100); "
    "absent when NVML cannot tell (no MIG support).",
    GPU_LABELS,
    "nvml",
    sample="slice_ratio",
)

# --- accelerator (GPM, Hopper and newer) -----------------------------------
GPU_SM_ACTIVE_RATIO: Final = _metric(
    "dam_gpu_sm_active_ratio",
    GAUGE,
    "GPM SM utilization over the sampling interval (Hopper+).",
    GPU_LABELS,
    "gpm",
    sample="gpm.sm_active",
)
GPU_SM_OCCUPANCY_RATIO: Final = _metric(
    "dam_gpu_sm_occupancy_ratio",
    GAUGE,
    "GPM SM occupancy: active warps over the theoretical maximum (Hopper+).",
    GPU_LABELS,
    "gpm",
    sample="gpm.sm_occupancy",
)
GPU_TENSOR_ACTIVE_RATIO: Final = _metric(
    "dam_gpu_tensor_active_ratio",
    GAUGE,
    "GPM any-tensor utilization: time the SMs ran tensor operations (Hopper+).",
    GPU_LABELS,
    "gpm",
    sample="gpm.tensor_active",
)
GPU_DRAM_BANDWIDTH_UTILIZATION_RATIO: Final = _metric(
    "dam_gpu_dram_bandwidth_utilization_ratio",
    GAUGE,
    "GPM DRAM bandwidth used over the theoretical maximum (Hopper+).",
    GPU_LABELS,
    "gpm",
    sample="gpm.dram_bandwidth_utilization",
)
GPU_FP16_ACTIVE_RATIO: Final = _metric(
    "dam_gpu_fp16_active_ratio",
    GAUGE,
    "GPM non-tensor FP16 activity (Hopper+).",
    GPU_LABELS,
    "gpm",
    sample="gpm.fp16_active",
)
GPU_FP32_ACTIVE_RATIO: Final = _metric(
    "dam_gpu_fp32_active_ratio",
    GAUGE,
    "GPM non-tensor FP32 activity (Hopper+).",
    GPU_LABELS,
    "gpm",
    sample="gpm.fp32_active",
)

# --- host CPU and memory (/proc, the training container's cgroup) ----------
PROCESS_CPU_SECONDS_TOTAL: Final = _metric(
    "dam_process_cpu_seconds_total",
    COUNTER,
    "CPU time of the training processes (role=main) and of their descendants, the DataLoader "
    "workers (role=worker).",
    (ROLE_LABEL,),
    "cpu",
)
PROCESS_CPU_WAIT_SECONDS_TOTAL: Final = _metric(
    "dam_process_cpu_wait_seconds_total",
    COUNTER,
    "Time the main thread of each training process (role=main) and of each DataLoader worker "
    "(role=worker) was runnable but waited for a CPU: the run-queue delay, "
    "/proc/<pid>/schedstat field 2 (read by the sidecar, or published by the probe when the "
    "sidecar cannot see the process).",
    (ROLE_LABEL,),
    "cpu",
)
PROCESSES: Final = _metric(
    "dam_processes",
    GAUGE,
    "Live training processes (role=main) and their descendants, the DataLoader workers (role=worker).",
    (ROLE_LABEL,),
    "cpu",
)
CONTAINER_CPU_THROTTLED_SECONDS_TOTAL: Final = _metric(
    "dam_container_cpu_throttled_seconds_total",
    COUNTER,
    "CFS throttled time of the training container's cgroup.",
    (),
    "cpu",
    sample="container_cpu.throttled_seconds",
)
CONTAINER_CPU_LIMIT_CORES: Final = _metric(
    "dam_container_cpu_limit_cores",
    GAUGE,
    "CFS CPU limit of the training container in cores (absent when unlimited).",
    (),
    "cpu",
    sample="container_cpu.limit_cores",
)
CONTAINER_CPU_SOURCE: Final = _metric(
    "dam_container_cpu_source",
    GAUGE,
    "Where the container CPU throttling and limit come from: 1 for the current source "
    "(cgroup: read by the sidecar; probe: read by the probe inside the training container; "
    "none).",
    (SOURCE_LABEL,),
    "cpu",
)
PROCESS_RESIDENT_MEMORY_BYTES: Final = _metric(
    "dam_process_resident_memory_bytes",
    GAUGE,
    "Resident memory of the training processes (role=main) and of their descendants, the "
    "DataLoader workers (role=worker).",
    (ROLE_LABEL,),
    "memory",
)
CONTAINER_MEMORY_USAGE_BYTES: Final = _metric(
    "dam_container_memory_usage_bytes",
    GAUGE,
    "Memory charged to the training container's cgroup (memory.current / memory.usage_in_bytes).",
    (),
    "memory",
    sample="container_memory.usage_bytes",
)
CONTAINER_MEMORY_LIMIT_BYTES: Final = _metric(
    "dam_container_memory_limit_bytes",
    GAUGE,
    "Memory limit of the training container's cgroup (absent when unlimited).",
    (),
    "memory",
    sample="container_memory.limit_bytes",
)
CONTAINER_OOM_KILLS_TOTAL: Final = _metric(
    "dam_container_oom_kills_total",
    COUNTER,
    "Processes the kernel's OOM killer killed in the training container's cgroup "
    "(memory.events oom_kill / memory.oom_control).",
    (),
    "memory",
    sample="container_memory.oom_kills",
)
DATALOADER_WORKER_KILLS_TOTAL: Final = _metric(
    "dam_dataloader_worker_kills_total",
    COUNTER,
    "DataLoader workers that died, counted for certain by the probe from DataLoader's own "
    'error ("worker (pid N) is killed by signal: ..."), each pid once; a worker killed by '
    "the OOM killer names the loader as the victim.",
    (),
    "probe",
)
CONTAINER_MEMORY_SOURCE: Final = _metric(
    "dam_container_memory_source",
    GAUGE,
    "Where the container memory figures come from: 1 for the current source (cgroup: read by "
    "the sidecar; probe: read by the probe inside the training container; none).",
    (SOURCE_LABEL,),
    "memory",
)
NODE_CPU_UTILIZATION_RATIO: Final = _metric(
    "dam_node_cpu_utilization_ratio",
    GAUGE,
    "Node CPU utilization between the last two samples.",
    (),
    "cpu",
    sample="cpu.node_utilization_ratio",
)

# --- the sidecar itself ------------------------------------------------------
SAMPLER_ERRORS_TOTAL: Final = _metric(
    "dam_sampler_errors_total",
    COUNTER,
    "Sampler faults by sampler (probe, nvml, cpu) and bounded reason.",
    ("sampler", "reason"),
    "sidecar",
)
SAMPLER_DURATION_SECONDS: Final = _metric(
    "dam_sampler_duration_seconds",
    GAUGE,
    "Duration of the latest sample of each sampler.",
    ("sampler",),
    "sidecar",
)
SNAPSHOT_TIMESTAMP_SECONDS: Final = _metric(
    "dam_snapshot_timestamp_seconds", GAUGE, "Unix time of the latest completed sample.", (), "sidecar"
)

# Every declaration above, in order; a name's declaration.
CATALOG: Final = tuple(_DECLARED)
BY_NAME: Final[Mapping[str, MetricSpec]] = {m.name: m for m in CATALOG}

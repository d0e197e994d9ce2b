"""Every metric the sidecar exports: name, type, labels and HELP text.

The collector takes its HELP texts from here and ``tools/gen_metrics_doc.py``
writes ``docs/metrics.md`` from here, so the documentation cannot drift.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from dam_contract import names as n

GPU_LABELS = ("gpu", "uuid")
RANK = (n.RANK_LABEL,)  # present only when the training process has a distributed rank


@dataclass(frozen=True)
class MetricSpec:
    name: str
    kind: Literal["counter", "gauge"]
    help: str
    labels: tuple[str, ...] = ()
    source: str = ""


CATALOG: tuple[MetricSpec, ...] = (
    # --- probe ---
    MetricSpec(
        n.DATALOADER_WAIT_SECONDS_TOTAL,
        "counter",
        "Time the training loop blocked waiting for the next batch, summed over training processes.",
        source="probe",
    ),
    MetricSpec(
        n.STEP_SECONDS_TOTAL,
        "counter",
        "Wall time covered by steps (between successive batch fetches), summed over training processes.",
        source="probe",
    ),
    MetricSpec(
        n.STEPS_TOTAL, "counter", "Steps (batches consumed), summed over training processes.", source="probe"
    ),
    MetricSpec(n.PROBE_UP, "gauge", "1 while at least one in-process probe is live, else 0.", source="probe"),
    MetricSpec(n.PROBE_PROCESSES, "gauge", "Training processes with a live probe file.", source="probe"),
    MetricSpec(
        n.BATCH_SIZE, "gauge", "Batch size of the latest batch (absent when unknown).", source="probe"
    ),
    MetricSpec(
        n.MODEL_FLOPS_PER_STEP,
        "gauge",
        "FLOPs of one training step: declared by the training script (source=declared), else counted "
        "once by the probe with torch's FlopCounterMode after warm-up (source=measured); absent when "
        "unknown (label rank when the process has one).",
        (n.RANK_LABEL, n.SOURCE_LABEL),
        "probe",
    ),
    MetricSpec(
        n.GOODPUT_SECONDS_TOTAL,
        "counter",
        "Productive step time since the process started: step time less data wait, exposed "
        "communication and checkpoint saves (label rank when the process has one).",
        RANK,
        "probe",
    ),
    MetricSpec(
        n.BADPUT_SECONDS_TOTAL,
        "counter",
        "Time lost since the process started, by cause: startup (process start to the first batch), "
        "data-wait, communication (exposed), checkpoint (blocked in torch.save and "
        "torch.distributed.checkpoint saves), other (the rest of the elapsed time); goodput plus "
        "badput is the elapsed time (label rank when the process has one).",
        (n.CAUSE_LABEL, n.RANK_LABEL),
        "probe",
    ),
    MetricSpec(
        n.CHECKPOINTS_TOTAL,
        "counter",
        "Checkpoint saves the training thread blocked in (label rank when the process has one).",
        RANK,
        "probe",
    ),
    MetricSpec(
        n.LAST_CHECKPOINT_TIMESTAMP_SECONDS,
        "gauge",
        "Unix time the latest checkpoint save (torch.save, torch.distributed.checkpoint) of the rank "
        "ended, kept after its process ended; absent until a save was seen (label rank when the "
        "process has one).",
        RANK,
        "probe",
    ),
    MetricSpec(
        n.STEPS_SINCE_CHECKPOINT,
        "gauge",
        "Steps the live processes took since their latest checkpoint save, every step of a process "
        "that saved none yet: the progress a restart would redo; absent while no live process times "
        "its saves (label rank when the process has one).",
        RANK,
        "probe",
    ),
    MetricSpec(
        n.COLLECTIVE_SECONDS_TOTAL,
        "counter",
        "Time in torch.distributed collectives and DDP gradient buckets, launch to completion, "
        "including the wait for peers (label rank when the process has one).",
        RANK,
        "probe",
    ),
    MetricSpec(
        n.COLLECTIVE_EXPOSED_SECONDS_TOTAL,
        "counter",
        "Communication the training thread waited for: with DDP, from the hand-over of the last "
        "gradient bucket to the completion of the step's last bucket; synchronous collectives whole "
        "(label rank when the process has one).",
        RANK,
        "probe",
    ),
    MetricSpec(
        n.COLLECTIVES_TOTAL,
        "counter",
        "Collectives completed (explicit torch.distributed calls and DDP gradient buckets).",
        RANK,
        "probe",
    ),
    MetricSpec(
        n.COLLECTIVE_BYTES_TOTAL,
        "counter",
        "Bytes this process contributed to collectives (input tensor sizes).",
        RANK,
        "probe",
    ),
    MetricSpec(
        n.PROCESS_RANK_INFO,
        "gauge",
        "1 per live training process with a distributed rank; local_rank and world_size are empty "
        "when unknown.",
        ("rank", "local_rank", "world_size"),
        "probe",
    ),
    # --- NVML ---
    MetricSpec(
        n.NVML_UP,
        "gauge",
        "1 when NVML answered the latest sample, 0 when absent, failing or stuck.",
        source="nvml",
    ),
    MetricSpec(
        n.GPU_ATTRIBUTION,
        "gauge",
        "How the reported GPUs were attributed to the job: 1 for the current state "
        "(probe, visible_devices, all, none).",
        ("state",),
        "nvml",
    ),
    MetricSpec(
        n.GPU_INFO, "gauge", "1 per reported GPU, with its model name.", ("gpu", "uuid", "name"), "nvml"
    ),
    MetricSpec(
        n.GPU_UTILIZATION_RATIO,
        "gauge",
        "NVML utilization.gpu: time a kernel was resident.",
        GPU_LABELS,
        "nvml",
    ),
    MetricSpec(
        n.GPU_MEMORY_BUSY_RATIO,
        "gauge",
        "NVML utilization.memory: time device memory was read or written.",
        GPU_LABELS,
        "nvml",
    ),
    MetricSpec(n.GPU_MEMORY_USED_BYTES, "gauge", "Device memory in use.", GPU_LABELS, "nvml"),
    MetricSpec(n.GPU_MEMORY_TOTAL_BYTES, "gauge", "Device memory installed.", GPU_LABELS, "nvml"),
    MetricSpec(n.GPU_POWER_WATTS, "gauge", "Board power draw.", GPU_LABELS, "nvml"),
    MetricSpec(n.GPU_SM_CLOCK_HERTZ, "gauge", "Current SM clock.", GPU_LABELS, "nvml"),
    MetricSpec(n.GPU_TEMPERATURE_CELSIUS, "gauge", "GPU die temperature.", GPU_LABELS, "nvml"),
    MetricSpec(
        n.GPU_THROTTLE_REASON,
        "gauge",
        "1 when the clock is held down for this reason (NVML clock event reasons), else 0.",
        ("gpu", "uuid", "reason"),
        "nvml",
    ),
    MetricSpec(n.GPU_PCIE_TX_BYTES_PER_SECOND, "gauge", "PCIe transmit throughput.", GPU_LABELS, "nvml"),
    MetricSpec(n.GPU_PCIE_RX_BYTES_PER_SECOND, "gauge", "PCIe receive throughput.", GPU_LABELS, "nvml"),
    MetricSpec(
        n.GPU_PCIE_BYTES_TOTAL,
        "counter",
        "PCIe traffic (direction tx/rx), integrated from the throughput NVML samples each interval.",
        ("gpu", "uuid", "direction"),
        "nvml",
    ),
    MetricSpec(
        n.GPU_NVLINK_BYTES_TOTAL,
        "counter",
        "NVLink data traffic over all links (direction tx/rx), from NVML field values "
        "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX/RX; absent without NVLink.",
        ("gpu", "uuid", "direction"),
        "nvml",
    ),
    MetricSpec(
        n.GPU_SM_ACTIVE_RATIO,
        "gauge",
        "GPM SM utilization over the sampling interval (Hopper+).",
        GPU_LABELS,
        "gpm",
    ),
    MetricSpec(
        n.GPU_SM_OCCUPANCY_RATIO,
        "gauge",
        "GPM SM occupancy: active warps over the theoretical maximum (Hopper+).",
        GPU_LABELS,
        "gpm",
    ),
    MetricSpec(
        n.GPU_TENSOR_ACTIVE_RATIO,
        "gauge",
        "GPM any-tensor utilization: time the SMs ran tensor operations (Hopper+).",
        GPU_LABELS,
        "gpm",
    ),
    MetricSpec(
        n.GPU_DRAM_BANDWIDTH_UTILIZATION_RATIO,
        "gauge",
        "GPM DRAM bandwidth used over the theoretical maximum (Hopper+).",
        GPU_LABELS,
        "gpm",
    ),
    MetricSpec(
        n.GPU_FP16_ACTIVE_RATIO, "gauge", "GPM non-tensor FP16 activity (Hopper+).", GPU_LABELS, "gpm"
    ),
    MetricSpec(
        n.GPU_FP32_ACTIVE_RATIO, "gauge", "GPM non-tensor FP32 activity (Hopper+).", GPU_LABELS, "gpm"
    ),
    # --- CPU ---
    MetricSpec(
        n.PROCESS_CPU_SECONDS_TOTAL,
        "counter",
        "CPU time of the training processes (role=main) and of their descendants, "
        "the DataLoader workers (role=worker).",
        ("role",),
        "cpu",
    ),
    MetricSpec(
        n.PROCESS_CPU_WAIT_SECONDS_TOTAL,
        "counter",
        "Time the main thread of each training process (role=main) and of each DataLoader worker "
        "(role=worker) was runnable but waited for a CPU: the run-queue delay, /proc/<pid>/schedstat "
        "field 2 (read by the sidecar, or published by the probe when the sidecar cannot see the process).",
        ("role",),
        "cpu",
    ),
    MetricSpec(
        n.PROCESSES,
        "gauge",
        "Live training processes (role=main) and their descendants, the DataLoader workers (role=worker).",
        ("role",),
        "cpu",
    ),
    MetricSpec(
        n.CONTAINER_CPU_THROTTLED_SECONDS_TOTAL,
        "counter",
        "CFS throttled time of the training container's cgroup.",
        source="cpu",
    ),
    MetricSpec(
        n.CONTAINER_CPU_LIMIT_CORES,
        "gauge",
        "CFS CPU limit of the training container in cores (absent when unlimited).",
        source="cpu",
    ),
    MetricSpec(
        n.CONTAINER_CPU_SOURCE,
        "gauge",
        "Where the container CPU throttling and limit come from: 1 for the current source "
        "(cgroup: read by the sidecar; probe: read by the probe inside the training container; none).",
        ("source",),
        "cpu",
    ),
    MetricSpec(
        n.PROCESS_RESIDENT_MEMORY_BYTES,
        "gauge",
        "Resident memory of the training processes (role=main) and of their descendants, "
        "the DataLoader workers (role=worker).",
        ("role",),
        "memory",
    ),
    MetricSpec(
        n.CONTAINER_MEMORY_USAGE_BYTES,
        "gauge",
        "Memory charged to the training container's cgroup (memory.current / memory.usage_in_bytes).",
        source="memory",
    ),
    MetricSpec(
        n.CONTAINER_MEMORY_LIMIT_BYTES,
        "gauge",
        "Memory limit of the training container's cgroup (absent when unlimited).",
        source="memory",
    ),
    MetricSpec(
        n.CONTAINER_OOM_KILLS_TOTAL,
        "counter",
        "Processes the kernel's OOM killer killed in the training container's cgroup "
        "(memory.events oom_kill / memory.oom_control).",
        source="memory",
    ),
    MetricSpec(
        n.DATALOADER_WORKER_KILLS_TOTAL,
        "counter",
        "DataLoader workers that died, counted for certain by the probe from DataLoader's own error "
        '("worker (pid N) is killed by signal: ..."), each pid once; a worker killed by the OOM killer '
        "names the loader as the victim.",
        source="probe",
    ),
    MetricSpec(
        n.CONTAINER_MEMORY_SOURCE,
        "gauge",
        "Where the container memory figures come from: 1 for the current source "
        "(cgroup: read by the sidecar; probe: read by the probe inside the training container; none).",
        ("source",),
        "memory",
    ),
    MetricSpec(
        n.NODE_CPU_UTILIZATION_RATIO,
        "gauge",
        "Node CPU utilization between the last two samples.",
        source="cpu",
    ),
    # --- the sidecar ---
    MetricSpec(
        n.SAMPLER_ERRORS_TOTAL,
        "counter",
        "Sampler faults by sampler (probe, nvml, cpu) and bounded reason.",
        ("sampler", "reason"),
        "sidecar",
    ),
    MetricSpec(
        n.SAMPLER_DURATION_SECONDS,
        "gauge",
        "Duration of the latest sample of each sampler.",
        ("sampler",),
        "sidecar",
    ),
    MetricSpec(
        n.SNAPSHOT_TIMESTAMP_SECONDS, "gauge", "Unix time of the latest completed sample.", source="sidecar"
    ),
)

BY_NAME: dict[str, MetricSpec] = {m.name: m for m in CATALOG}

"""Metric names: the contract of docs/architecture.md (metric names), in one place.

The sidecar exports these, the operator and ``dam evaluate`` read them, the
Grafana dashboard and the alert rules query them. Nothing else in the code
base spells a ``dam_`` metric name by hand.
"""

from __future__ import annotations

from typing import Final

# --- training loop (from the in-process probe) -----------------------------
DATALOADER_WAIT_SECONDS_TOTAL: Final = "dam_dataloader_wait_seconds_total"
STEP_SECONDS_TOTAL: Final = "dam_step_seconds_total"
STEPS_TOTAL: Final = "dam_steps_total"
PROBE_UP: Final = "dam_probe_up"
BATCH_SIZE: Final = "dam_batch_size"
MODEL_FLOPS_PER_STEP: Final = "dam_model_flops_per_step"
# Goodput: productive step time and the time lost by cause (from the probe, per rank).
GOODPUT_SECONDS_TOTAL: Final = "dam_goodput_seconds_total"
BADPUT_SECONDS_TOTAL: Final = "dam_badput_seconds_total"
CHECKPOINTS_TOTAL: Final = "dam_checkpoints_total"
# Progress at risk: what a restart would redo (the operator's ``restart`` badput reads them).
LAST_CHECKPOINT_TIMESTAMP_SECONDS: Final = "dam_last_checkpoint_timestamp_seconds"
STEPS_SINCE_CHECKPOINT: Final = "dam_steps_since_checkpoint"
# Communication (torch.distributed collectives and DDP gradient buckets, from the probe).
COLLECTIVE_SECONDS_TOTAL: Final = "dam_collective_seconds_total"
COLLECTIVE_EXPOSED_SECONDS_TOTAL: Final = "dam_collective_exposed_seconds_total"
COLLECTIVES_TOTAL: Final = "dam_collectives_total"
COLLECTIVE_BYTES_TOTAL: Final = "dam_collective_bytes_total"
PROCESS_RANK_INFO: Final = "dam_process_rank_info"

# --- accelerator (NVML; GPM on Hopper and newer) ---------------------------
GPU_UTILIZATION_RATIO: Final = "dam_gpu_utilization_ratio"
GPU_MEMORY_BUSY_RATIO: Final = "dam_gpu_memory_busy_ratio"
GPU_SM_ACTIVE_RATIO: Final = "dam_gpu_sm_active_ratio"
GPU_SM_OCCUPANCY_RATIO: Final = "dam_gpu_sm_occupancy_ratio"
GPU_TENSOR_ACTIVE_RATIO: Final = "dam_gpu_tensor_active_ratio"
GPU_DRAM_BANDWIDTH_UTILIZATION_RATIO: Final = "dam_gpu_dram_bandwidth_utilization_ratio"
GPU_FP16_ACTIVE_RATIO: Final = "dam_gpu_fp16_active_ratio"
GPU_FP32_ACTIVE_RATIO: Final = "dam_gpu_fp32_active_ratio"
GPU_MEMORY_USED_BYTES: Final = "dam_gpu_memory_used_bytes"
GPU_MEMORY_TOTAL_BYTES: Final = "dam_gpu_memory_total_bytes"
GPU_POWER_WATTS: Final = "dam_gpu_power_watts"
GPU_SM_CLOCK_HERTZ: Final = "dam_gpu_sm_clock_hertz"
GPU_TEMPERATURE_CELSIUS: Final = "dam_gpu_temperature_celsius"
GPU_THROTTLE_REASON: Final = "dam_gpu_clock_throttle_reason"
GPU_PCIE_TX_BYTES_PER_SECOND: Final = "dam_gpu_pcie_tx_bytes_per_second"
GPU_PCIE_RX_BYTES_PER_SECOND: Final = "dam_gpu_pcie_rx_bytes_per_second"
GPU_NVLINK_BYTES_TOTAL: Final = "dam_gpu_nvlink_bytes_total"
GPU_PCIE_BYTES_TOTAL: Final = "dam_gpu_pcie_bytes_total"
GPU_INFO: Final = "dam_gpu_info"
NVML_UP: Final = "dam_nvml_up"
GPU_ATTRIBUTION: Final = "dam_gpu_attribution"

# --- host CPU ----------------------------------------------------------------
PROCESS_CPU_SECONDS_TOTAL: Final = "dam_process_cpu_seconds_total"
PROCESS_CPU_WAIT_SECONDS_TOTAL: Final = "dam_process_cpu_wait_seconds_total"
PROCESSES: Final = "dam_processes"
CONTAINER_CPU_THROTTLED_SECONDS_TOTAL: Final = "dam_container_cpu_throttled_seconds_total"
CONTAINER_CPU_LIMIT_CORES: Final = "dam_container_cpu_limit_cores"
CONTAINER_CPU_SOURCE: Final = "dam_container_cpu_source"
NODE_CPU_UTILIZATION_RATIO: Final = "dam_node_cpu_utilization_ratio"
PROCESS_RESIDENT_MEMORY_BYTES: Final = "dam_process_resident_memory_bytes"

# --- host memory (the training container's cgroup) ---------------------------
CONTAINER_MEMORY_USAGE_BYTES: Final = "dam_container_memory_usage_bytes"
CONTAINER_MEMORY_LIMIT_BYTES: Final = "dam_container_memory_limit_bytes"
CONTAINER_OOM_KILLS_TOTAL: Final = "dam_container_oom_kills_total"
DATALOADER_WORKER_KILLS_TOTAL: Final = "dam_dataloader_worker_kills_total"
CONTAINER_MEMORY_SOURCE: Final = "dam_container_memory_source"

# --- the sidecar itself ------------------------------------------------------
SAMPLER_ERRORS_TOTAL: Final = "dam_sampler_errors_total"
SNAPSHOT_TIMESTAMP_SECONDS: Final = "dam_snapshot_timestamp_seconds"
SAMPLER_DURATION_SECONDS: Final = "dam_sampler_duration_seconds"
PROBE_PROCESSES: Final = "dam_probe_processes"

# Label values that are bounded by construction.
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
# Labels of the per-rank and interconnect series.
RANK_LABEL: Final = "rank"
DIRECTION_TX: Final = "tx"
DIRECTION_RX: Final = "rx"

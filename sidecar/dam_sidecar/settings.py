"""Settings of the sidecar process: one object, built once in ``main`` (``DAM_`` prefix)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AliasChoices, Field, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

AttributionFallback = Literal["visible_devices", "none", "all"]


class SidecarSettings(BaseSettings):
    """Everything the sidecar reads from its environment.

    Command-line flags of ``dam sidecar`` override these (they are passed as
    keyword arguments, which take precedence over the environment).
    """

    model_config = SettingsConfigDict(env_prefix="DAM_", extra="ignore", populate_by_name=True)

    probe_dir: str = Field(default="/dam/probe", description="Directory of the probe files (DAM_PROBE_DIR).")
    host: str = Field(default="0.0.0.0", description="Address /metrics listens on.")
    port: int = Field(default=9450, ge=0, le=65535, description="Port of /metrics and /healthz.")
    interval_seconds: float = Field(default=1.0, gt=0, le=3600, description="Sampling period.")
    termination_message_path: str = Field(
        default="/dev/termination-log",
        description=(
            "The sidecar container's termination-message file (its terminationMessagePath): on SIGTERM "
            "it writes each rank's goodput figures there for the operator (dam_sidecar.farewell); "
            "the file is the kubelet's, never created. Empty: write nothing."
        ),
    )
    nvml_timeout_seconds: float = Field(
        default=2.0, gt=0, le=600, description="Watchdog: an NVML sample that takes longer marks NVML stuck."
    )
    proc_root: str = Field(default="/proc", description="Root of the proc file system to read.")
    cgroup_root: str = Field(default="/sys/fs/cgroup", description="Root of the cgroup file system to read.")
    pids: Annotated[list[int], NoDecode] = Field(
        default_factory=list,
        description="Extra training process ids (comma-separated) besides those of the probe files.",
    )
    probe_stale_seconds: float = Field(
        default=60.0,
        gt=0,
        description="A probe file whose pid is not visible stays live this long after its last update.",
    )
    gpu_attribution_fallback: AttributionFallback = Field(
        default="visible_devices",
        description=(
            "Which GPUs to report when no probe file publishes device UUIDs: the UUIDs listed in "
            "NVIDIA_VISIBLE_DEVICES/CUDA_VISIBLE_DEVICES, none, or all GPUs the sidecar sees."
        ),
    )
    visible_devices: str | None = Field(
        default=None,
        validation_alias=AliasChoices(
            "visible_devices", "DAM_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES"
        ),
        description="Device list used by the visible_devices fallback.",
    )
    error_log_interval_seconds: float = Field(
        default=60.0, ge=0, description="At most one log line per sampler and reason in this period."
    )
    fake_gpus: int = Field(
        default=0,
        ge=0,
        le=64,
        description="Benchmarks and tests only: serve N simulated GPUs instead of NVML.",
    )
    clock_ticks_per_second: int = Field(default=0, ge=0, description="0: os.sysconf('SC_CLK_TCK').")
    http_listen_backlog: int = Field(
        default=1024,
        ge=1,
        le=65535,
        description=(
            "Connections the kernel queues before /metrics accepts them (listen(2) backlog; Linux caps it "
            "at net.core.somaxconn)."
        ),
    )
    http_max_connections: int = Field(
        default=1024,
        ge=1,
        le=65536,
        description=(
            "Open HTTP connections at most (lowered to fit the descriptor limit); past it the oldest idle "
            "or still-sending connection is closed."
        ),
    )
    http_worker_threads: int = Field(
        default=4,
        ge=1,
        le=64,
        description="Threads that render OpenMetrics answers (the text format is cached).",
    )
    http_request_timeout_seconds: float = Field(
        default=5.0,
        gt=0,
        le=600,
        description=(
            "A request's line, headers and body must arrive within this of its first byte (of the accept on "
            "a new connection); otherwise 408 and the connection is closed."
        ),
    )
    http_idle_timeout_seconds: float = Field(
        default=75.0,
        gt=0,
        le=3600,
        description="A kept-alive connection with no new request this long is closed.",
    )
    http_write_timeout_seconds: float = Field(
        default=10.0, gt=0, le=600, description="A response the client does not read within this is dropped."
    )
    http_max_header_bytes: int = Field(
        default=16384, ge=1024, le=1048576, description="Larger request heads get 431."
    )
    http_max_body_bytes: int = Field(
        default=65536, ge=0, le=16777216, description="Larger request bodies get 413 (no endpoint takes one)."
    )

    @field_validator("pids", mode="before")
    @classmethod
    def _split_pids(cls, value: object) -> object:
        if isinstance(value, str):
            parts = [p.strip() for p in value.replace(" ", ",").split(",") if p.strip()]
            try:
                return [int(p) for p in parts]
            except ValueError:
                raise ValueError(
                    f"DAM_PIDS must be a comma-separated list of process ids, got {value!r}"
                ) from None
        return value

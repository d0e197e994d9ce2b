"""Which GPUs belong to the training job, so that the sidecar never reports another tenant's GPUs.

1. ``probe``: the probe files publish the training processes' device UUIDs;
   only those GPUs are reported.
2. When no probe publishes UUIDs, ``gpu_attribution_fallback`` decides:
   ``visible_devices`` (default) reports the GPUs whose UUIDs are listed in
   ``NVIDIA_VISIBLE_DEVICES``/``CUDA_VISIBLE_DEVICES`` (indices, ``all`` or an empty
   list attribute nothing); ``all`` reports every GPU the sidecar sees (a
   single-tenant node, opt-in); ``none`` reports none.
3. Otherwise ``none``: no GPU series at all, and ``dam_gpu_attribution{state="none"} 1``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from dam_sidecar.settings import AttributionFallback

log = logging.getLogger("dam_sidecar")

STATES: tuple[str, ...] = ("probe", "visible_devices", "all", "none")


@dataclass(frozen=True)
class Attribution:
    state: str
    uuids: frozenset[str] | None  # None: every GPU

    def admits(self, uuid: str) -> bool:
        return self.uuids is None or uuid in self.uuids


def visible_uuids(value: str | None) -> frozenset[str]:
    if not value:
        return frozenset()
    items = [v.strip() for v in value.split(",") if v.strip()]
    if not items or any(not (v.startswith("GPU-") or v.startswith("MIG-")) for v in items):
        return frozenset()  # indices or "all": cannot tell which physical GPUs these are
    return frozenset(items)


class Attributor:
    """Decides per tick; logs one line whenever the decision changes."""

    def __init__(self, fallback: AttributionFallback, visible_devices: str | None) -> None:
        self._fallback = fallback
        self._visible = visible_uuids(visible_devices)
        self._raw_visible = visible_devices
        self._last_state: str | None = None

    def decide(self, probe_uuids: Sequence[str]) -> Attribution:
        if probe_uuids:
            result = Attribution("probe", frozenset(probe_uuids))
        elif self._fallback == "visible_devices" and self._visible:
            result = Attribution("visible_devices", self._visible)
        elif self._fallback == "all":
            result = Attribution("all", None)
        else:
            result = Attribution("none", frozenset())
        if result.state != self._last_state:
            self._last_state = result.state
            if result.state == "none":
                log.warning(
                    "gpu attribution: none (no probe publishes device UUIDs; fallback=%s, "
                    "visible devices=%r); no GPU series are reported",
                    self._fallback,
                    self._raw_visible,
                )
            else:
                shown = "every GPU" if result.uuids is None else ",".join(sorted(result.uuids))
                log.info("gpu attribution: %s (%s)", result.state, shown)
        return result

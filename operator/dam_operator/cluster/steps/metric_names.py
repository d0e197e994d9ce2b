"""Names of the operator's own metrics (its ``/metrics``), in one place.

The Grafana dashboard, the alert rules and the tests use these; the sidecar's
names live in ``dam_contract.names``.
"""

from __future__ import annotations

from typing import Final

# One series per profile; label values bounded (axis/regime are enums).
PROFILE_VERDICT: Final = "dam_profile_verdict"  # {namespace, profile, axis, regime, lever} = 1
PROFILE_CONFIDENCE_RATIO: Final = "dam_profile_confidence_ratio"  # {namespace, profile}
PROFILE_IRON_LAW_SECONDS: Final = "dam_profile_iron_law_seconds"  # {namespace, profile, term}
PROFILE_DATA_WAIT_RATIO: Final = "dam_profile_data_wait_ratio"  # {namespace, profile}
PROFILE_STEPS_PER_SECOND: Final = "dam_profile_steps_per_second"  # {namespace, profile}
PROFILE_MFU_RATIO: Final = "dam_profile_mfu_ratio"  # {namespace, profile}
PROFILE_PODS: Final = "dam_profile_pods"  # {namespace, profile, state=matched|instrumented|reporting}
PROFILE_LAST_EVALUATION_TIMESTAMP_SECONDS: Final = "dam_profile_last_evaluation_timestamp_seconds"
# Goodput (status.goodput): accelerator-seconds by use {namespace, profile, use}, counted since this
# operator process started; the life-so-far ratio {namespace, profile}.
PROFILE_ACCELERATOR_SECONDS_TOTAL: Final = "dam_profile_accelerator_seconds_total"
PROFILE_GOODPUT_RATIO: Final = "dam_profile_goodput_ratio"
# One series per entry of status.actions (bounded: about 10 per profile).
PROFILE_ACTION_INFO: Final = "dam_profile_action_info"
# {namespace, profile, action, lever, setting, before, after, outcome} = 1
PROFILE_ACTION_STEPS_PER_SECOND: Final = "dam_profile_action_steps_per_second"
# {namespace, profile, action, phase=before|after}
# Progress (status.progress): seconds without a step while Stalled (0 otherwise) {namespace, profile};
# the state as a state set {namespace, profile, state} (PROGRESS_STATES, 1 for the current one).
PROFILE_STALLED_SECONDS: Final = "dam_profile_stalled_seconds"
PROFILE_PROGRESS_STATE: Final = "dam_profile_progress_state"
PROGRESS_STATES: Final = ("NotStarted", "Progressing", "Stalled")

OPERATOR_EVALUATIONS_TOTAL: Final = "dam_operator_evaluations_total"
OPERATOR_EVALUATION_ERRORS_TOTAL: Final = "dam_operator_evaluation_errors_total"  # {reason}
OPERATOR_SCRAPE_DURATION_SECONDS: Final = "dam_operator_scrape_duration_seconds"  # histogram
OPERATOR_EVALUATION_DELAY_SECONDS: Final = "dam_operator_evaluation_delay_seconds"  # histogram
OPERATOR_WEBHOOK_REQUESTS_TOTAL: Final = "dam_operator_webhook_requests_total"  # {result}
OPERATOR_PROFILES: Final = "dam_operator_profiles"
OPERATOR_ACTIONS_TOTAL: Final = "dam_operator_actions_total"  # {outcome}
OPERATOR_SOURCE_BODY_TOO_LARGE_TOTAL: Final = "dam_operator_source_body_too_large_total"  # {source}
OPERATOR_SHARD_BUCKETS: Final = "dam_operator_shard_buckets"
OPERATOR_SHARD_MEMBERS: Final = "dam_operator_shard_members"

IRON_LAW_TERMS: Final = ("data", "compute", "latency")
USE_PRODUCTIVE: Final = "productive"
USE_RESTART: Final = "restart"
USE_STALLED: Final = "stalled"
ACCELERATOR_USES: Final = (
    USE_PRODUCTIVE,
    "startup",
    "data-wait",
    "communication",
    "checkpoint",
    USE_RESTART,
    "other",
    USE_STALLED,
)
"""``use`` of dam_profile_accelerator_seconds_total: productive, or a badput cause. The probe's causes
(dam_badput_seconds_total{cause}) and ``restart`` and ``stalled``, which only the operator sees
(``stalled``: the probes' ``other`` while the job made no step, ``cluster.steps.progress_step``)."""
POD_STATES: Final = ("matched", "instrumented", "reporting")

# Closed sets of label values: every one is exported at 0 from the start, so that a
# healthy operator's dashboard panels and rate() alerts have a series to read.
SCRAPE_ERROR_REASONS: Final = (
    "scrape-timeout",
    "scrape-unreachable",
    "scrape-http-status",
    "scrape-too-large",
    "scrape-garbage",
    "scrape-no-data",
    "scrape-refused",
)
API_ERROR_REASONS: Final = (
    "api-connection",
    "api-5xx",
    "api-404",
    "api-409",
    "api-410",
    "api-422",
    "api-429",
    "api-4xx",
)
OTHER_ERROR_REASONS: Final = ("event-failed", "evaluation-overrun", "internal", "unknown")
ERROR_REASONS: Final = (*SCRAPE_ERROR_REASONS, *API_ERROR_REASONS, *OTHER_ERROR_REASONS)
WEBHOOK_RESULTS: Final = ("injected", "skipped", "no-profile", "error")
ACTION_OUTCOMES: Final = ("pending", "improved", "no-change", "worse", "rolled-back")
"""``status.actions[].outcome``; ``pending`` is counted when an action is planned."""
ACTION_PHASES: Final = ("before", "after")
BODY_SOURCES: Final = ("scrape", "prometheus")
"""Where a body the operator reads comes from: a sidecar's ``/metrics`` or a Prometheus answer."""

"""A mistyped DAM_ variable is named, with the setting it probably meant."""

from __future__ import annotations

from dam_operator.cluster.settings import OperatorSettings
from dam_sidecar.envcheck import known_variables, unknown_variables
from dam_sidecar.settings import SidecarSettings


def test_a_typo_is_reported_with_the_closest_setting() -> None:
    known = known_variables(OperatorSettings, SidecarSettings)
    env = {"DAM_SCRAPE_TIMEOUT_SECOND": "3", "DAM_SCRAPE_TIMEOUT_SECONDS": "3", "HOME": "/root"}
    (warning,) = unknown_variables(env, known)
    assert warning.startswith("DAM_SCRAPE_TIMEOUT_SECOND is not a setting")
    assert "did you mean DAM_SCRAPE_TIMEOUT_SECONDS?" in warning


def test_every_components_variables_are_known_including_the_probes() -> None:
    known = known_variables(OperatorSettings, SidecarSettings)
    env = {
        "DAM_WEBHOOK_MANAGE_CONFIGURATION": "false",
        "DAM_INTERVAL_SECONDS": "1",
        "DAM_PROBE_DIR": "/dam/probe",
        "DAM_LOADER_OVERRIDES": "{}",
        "dam_port": "9450",
    }
    assert unknown_variables(env, known) == []


def test_a_name_far_from_any_setting_gets_no_guess() -> None:
    (warning,) = unknown_variables({"DAM_XYZZY": "1"}, known_variables(SidecarSettings))
    assert "did you mean" not in warning

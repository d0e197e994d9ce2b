"""The Apply lever table and its one climb, shared by `dam tune` and the operator's Apply mode:
the ladders, the climb's stop rule, which verdicts may pull which lever, the judge, and that the
table agrees with the probe's overrides and the CRD."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from dam_operator.diagnosis import climb, levers, regimes
from dam_operator.diagnosis.climb import Bounds, Channel, Judging, Rate, Tried, next_value
from dam_operator.diagnosis.levers import (
    APPLY,
    ENABLE_PIN_MEMORY,
    INCREASE_DATALOADER_WORKERS,
    RAISE_CPU_LIMIT,
    RAISE_PREFETCH_FACTOR,
)
from dam_operator.diagnosis.model import Regime
from dam_probe.overrides import SETTINGS, loader_override_env, parse_overrides

ROOT = Path(__file__).resolve().parents[3]
WORKERS = APPLY[INCREASE_DATALOADER_WORKERS]
PREFETCH = APPLY[RAISE_PREFETCH_FACTOR]
LOADER = frozenset({Channel.LOADER})
EVERYWHERE = frozenset(Channel)


# --- ladders and the climb (moved from tests/unit/local/test_tune.py, same assertions) -----------


def test_workers_climb_by_powers_of_two_up_to_the_bound() -> None:
    assert [WORKERS.ladder(v, 8) for v in (0, 1, 2, 3, 4, 8)] == [1, 2, 4, 4, 8, None]
    assert WORKERS.ladder(4, 6) == 6, "the bound itself between two rungs"
    assert WORKERS.ladder(2, 2) is None


def test_prefetch_doubles_up_to_its_cap() -> None:
    assert [PREFETCH.ladder(v, 16) for v in (2, 4, 8, 16)] == [4, 8, 16, None]


def test_the_climb_continues_after_a_kept_step_and_stops_after_one_that_gains_nothing() -> None:
    assert next_value(WORKERS, 0, 8) == 1
    assert next_value(WORKERS, 2, 8, Tried(2, kept=True)) == 4
    assert next_value(WORKERS, 2, 8, Tried(4, kept=False)) is None
    assert next_value(PREFETCH, 2, 16, Tried(4, kept=False)) is None


def test_one_worker_that_gains_nothing_still_leads_to_two() -> None:
    # One worker only overlaps loading with the step; two parallelise it.
    assert next_value(WORKERS, 0, 8, Tried(1, kept=False)) == 2
    assert next_value(WORKERS, 0, 1, Tried(1, kept=False)) is None, "never past the CPU bound"


def test_a_cpu_raise_doubles_within_its_cap_and_never_without_one() -> None:
    cpu = APPLY[RAISE_CPU_LIMIT]
    assert cpu.ladder(2000, cpu.bound(Bounds(max_cpu_millicores=16000))) == 4000
    assert cpu.ladder(1500, 2500) == 2500
    assert cpu.ladder(3000, 3100) is None, "less than 5 % is not worth a restart"
    assert cpu.ladder(2000, cpu.bound(Bounds())) is None, "no maxCpu: never raised"


def test_workers_are_bounded_by_the_cpus_of_a_loader_and_the_cap() -> None:
    assert WORKERS.bound(Bounds(cpus_per_loader=3, max_workers=16)) == 3
    assert WORKERS.bound(Bounds(cpus_per_loader=None, max_workers=16)) == 16
    assert WORKERS.bound(Bounds(cpus_per_loader=512)) == 256, "the probe accepts at most 256"


# --- which verdict may pull which lever -----------------------------------------------------------


def test_only_a_table_lever_of_its_regime_that_the_caller_can_reach_is_applicable() -> None:
    assert levers.applicable(INCREASE_DATALOADER_WORKERS, Regime.INPUT_BOUND, LOADER) is WORKERS
    assert levers.applicable(INCREASE_DATALOADER_WORKERS, Regime.COMPUTE_BOUND, EVERYWHERE) is None
    assert levers.applicable("use-sequential-shards", Regime.INPUT_BOUND, EVERYWHERE) is None, "a code change"
    assert levers.applicable(RAISE_CPU_LIMIT, Regime.INPUT_BOUND, LOADER) is None, "dam tune sets no pod CPU"
    assert levers.applicable(RAISE_CPU_LIMIT, Regime.INPUT_BOUND, EVERYWHERE) is APPLY[RAISE_CPU_LIMIT]


def test_more_workers_hand_on_to_prefetch_and_the_other_levers_climb_alone() -> None:
    assert levers.chain(INCREASE_DATALOADER_WORKERS, EVERYWHERE) == [WORKERS, PREFETCH]
    assert levers.chain(RAISE_PREFETCH_FACTOR, EVERYWHERE) == [PREFETCH]
    assert levers.chain(ENABLE_PIN_MEMORY, EVERYWHERE) == [APPLY[ENABLE_PIN_MEMORY]]
    assert levers.chain(RAISE_CPU_LIMIT, LOADER) == []
    assert levers.chain("enable-bf16", EVERYWHERE) == []


def test_prefetch_needs_workers_and_pinned_memory_a_gpu() -> None:
    pin = APPLY[ENABLE_PIN_MEMORY]
    assert not PREFETCH.needs(climb.Facts({"num_workers": 0}))
    assert PREFETCH.needs(climb.Facts({"num_workers": 2}))
    assert not pin.needs(climb.Facts({}, gpus=0)) and pin.needs(climb.Facts({}, gpus=1))


# --- the judge both loops use ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("after", "outcome"),
    [(4.4, "improved"), (4.39, "no-change"), (3.61, "no-change"), (3.6, "worse")],
)
def test_a_relative_margin_is_inclusive_at_both_ends(after: float, outcome: str) -> None:
    assert climb.judge(Rate(4.0), Rate(after), Judging(margin=0.10)).outcome == outcome


def test_the_gain_must_beat_the_noise_of_the_difference_and_the_minimum_gain() -> None:
    rule = Judging(sigmas=2.0, min_gain=0.05)
    # 2 × √(3² + 4²) = 10 steps/s of noise
    within = climb.judge(Rate(100.0, 4.0), Rate(108.0, 3.0), rule)
    assert (within.outcome, within.reason, within.noise) == ("no-change", "within-noise", 10.0)
    small = climb.judge(Rate(100.0, 0.01), Rate(102.5, 0.01), rule)
    assert (small.outcome, small.reason) == ("no-change", "below-min-gain")
    assert climb.judge(Rate(30.0, 1.0), Rate(60.0, 1.0), rule).outcome == "improved"
    assert climb.judge(Rate(30.0, 0.1), Rate(20.0, 0.1), rule).reason == "slower"


# --- the table agrees with the probe and the CRD --------------------------------------------------


def _rungs(lever: climb.ApplyLever, start: int, bound: int | None) -> list[int]:
    out = [start]
    while (nxt := lever.ladder(out[-1], bound)) is not None:
        assert nxt > out[-1], f"{lever.id}: {out[-1]} → {nxt} does not climb"
        out.append(nxt)
        assert len(out) < 64, f"{lever.id}: the ladder does not end"
    return out


@pytest.mark.parametrize(
    "lever", [a for a in APPLY.values() if a.channel is Channel.LOADER], ids=lambda a: a.id
)
def test_every_loader_lever_climbs_to_its_bound_through_values_the_probe_accepts(
    lever: climb.ApplyLever,
) -> None:
    assert lever.setting in SETTINGS, f"{lever.setting}: not a setting of dam_probe.overrides"
    start = lever.default if lever.default is not None else 0
    for value in _rungs(lever, start, lever.bound(Bounds(cpus_per_loader=8))):
        env = loader_override_env({lever.setting: value})
        assert parse_overrides(next(iter(env.values()))).settings()[lever.setting] == value


def test_every_apply_lever_is_in_the_catalogue_and_effective_in_its_regimes() -> None:
    for lever in APPLY.values():
        assert levers.sentence(lever.id) != lever.id, f"{lever.id}: no sentence in levers.LEVERS"
        for regime in lever.regimes:
            assert lever.id in regimes.SPECS[regime].working, f"{lever.id}: not effective in {regime}"
    assert set(levers.APPLY_SETTINGS) == {a.setting for a in APPLY.values()}, "one lever per setting"


def _crd_setting_names() -> set[str]:
    crd: Any = yaml.safe_load((ROOT / "crds" / "damprofile.yaml").read_text())
    (version,) = [v for v in crd["spec"]["versions"] if v.get("storage")]
    action = version["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]["actions"]["items"]
    return set(action["properties"]["setting"]["properties"]["name"]["enum"])


def test_the_crd_lists_exactly_the_settings_of_the_table() -> None:
    assert _crd_setting_names() == set(levers.APPLY_SETTINGS), (
        "status.actions[].setting.name in crds/damprofile.yaml (and its copy in deploy/dam-operator.yaml) "
        "must list the settings of levers.APPLY"
    )


@pytest.mark.parametrize(
    ("kind", "value", "text"),
    [("count", 4, "4"), ("switch", True, "true"), ("millicores", 1500, "1500m"), ("millicores", 4000, "4")],
)
def test_values_are_written_and_read_back_as_the_status_holds_them(kind: str, value: int, text: str) -> None:
    assert climb.render(climb.Kind(kind), value) == text
    assert climb.parse(climb.Kind(kind), text) == value

"""No collector reads what another one sampled: the probe files are one feed, refreshed once a tick
before any collector samples, and handed to the collectors that read them (GPU attribution, the
host's pids and container fallbacks). So the collectors sample in any order with the same result."""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence

import pytest

from dam_contract import names as n
from dam_sidecar.attribution import Attributor
from dam_sidecar.collector import SidecarCollector, standard_collectors
from dam_sidecar.collectors.base import SourceCollector
from dam_sidecar.errors import ErrorLog
from dam_sidecar.exposition import render
from dam_sidecar.samplers.cpu import CpuSample, PublishedCpu
from dam_sidecar.samplers.probe import ProbeSample
from tests.unit.sidecar.test_exposition_golden import GOLDEN, SCENARIOS, Fixed


class CountingProbe:
    """The probe files' source, counting its reads; raises while ``broken``."""

    def __init__(self, value: ProbeSample) -> None:
        self.value = value
        self.reads = 0
        self.broken = False

    def sample(self) -> ProbeSample:
        self.reads += 1
        if self.broken:
            raise OSError("probe directory unreadable")
        return self.value


class RecordingCpu:
    """The host's source, recording the pids it is asked about."""

    def __init__(self, value: CpuSample) -> None:
        self.value = value
        self.asked: list[tuple[int, ...]] = []

    def sample(self, pids: Iterable[int] = ()) -> CpuSample:
        self.asked.append(tuple(pids))
        return self.value


def _collectors(scenario: str, errors: ErrorLog) -> tuple[list[SourceCollector], CountingProbe, RecordingCpu]:
    probe, nvml, cpu = SCENARIOS[scenario]
    counting, recording = CountingProbe(probe), RecordingCpu(cpu)
    collectors = standard_collectors(
        probe=counting,  # type: ignore[arg-type]
        nvml=Fixed(nvml),  # type: ignore[arg-type]
        cpu=recording,  # type: ignore[arg-type]
        errors=errors,
        attributor=Attributor("visible_devices", None),
        published=PublishedCpu(own_namespace=0),
    )
    return collectors, counting, recording


def _tick(order: Sequence[SourceCollector], errors: ErrorLog) -> None:
    timer = itertools.cycle((0.0, 0.001)).__next__
    SidecarCollector(order, errors=errors, clock=lambda: 1_700_000_100.25, timer=timer).sample_now()


def _errors() -> ErrorLog:
    errors = ErrorLog()  # the golden files' two recorded faults
    errors.record("nvml", "not_supported", "GPU 1: power is not supported; series absent")
    errors.record("cpu", "proc_parse", "/proc/1/stat: bad")
    return errors


@pytest.mark.parametrize("scenario", ["full", "probe-sourced"])
def test_collectors_sampled_in_any_order_write_the_golden_lines(scenario: str) -> None:
    golden = sorted(GOLDEN.joinpath(f"{scenario}.prom").read_bytes().splitlines())
    for order in itertools.permutations(range(4)):
        errors = _errors()
        collectors, _, _ = _collectors(scenario, errors)
        _tick([collectors[i] for i in order], errors)
        text = render(f for c in collectors for f in c.collect())  # shown in the standard order
        # The durations are listed in sampling order; every line, GPU attribution and the
        # host's figures for the probe's pids included, is the golden one.
        assert sorted(text.splitlines()) == golden, f"sampling order {order} changed the exposition"


def test_the_probe_files_are_read_once_a_tick_for_all_three_collectors_that_read_them() -> None:
    errors = ErrorLog()
    collectors, probe, cpu = _collectors("full", errors)
    sidecar = SidecarCollector(list(reversed(collectors)), errors=errors)
    sidecar.sample_now()
    sidecar.sample_now()
    assert probe.reads == 2
    assert cpu.asked == [(101, 102), (101, 102)]  # the probe's live pids of the same tick, not a tick late


def test_an_unreadable_probe_directory_is_the_probe_sampler_s_fault_and_no_process_counts_live() -> None:
    errors = ErrorLog()
    collectors, probe, cpu = _collectors("full", errors)
    sidecar = SidecarCollector(list(reversed(collectors)), errors=errors)
    sidecar.sample_now()
    probe.broken = True
    sidecar.sample_now()
    assert errors.counts() == {("probe", "exception"): 1}
    assert cpu.asked[-1] == ()  # the host reads no pid the probe could not vouch for this tick
    text = sidecar.text().decode()
    assert "dam_probe_up 0.0" in text
    assert f'{n.SAMPLER_DURATION_SECONDS}{{sampler="probe"}}' in text  # still timed as the probe's

"""The processes' exit totals (``dam_probe.lastwords.Totals``) in the goodput ledger and the
registry: what a process did between its pod's last scrape and its end counts as what it was,
and a replacement's restart runs from that end (issue 28's node runs: a deleted rank's restart
read 3.1 s, 10 %, over the job's own, the half window after its last scrape)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from dam_operator.cluster.steps import registry as reg
from dam_operator.cluster.steps.goodput import GoodputLedger, exit_reading
from dam_operator.cluster.steps.registry import PodInfo, Registry, RestartRecord, exit_words
from dam_operator.cluster.steps.spec import parse_spec
from dam_probe.lastwords import LastWords, Totals

from .test_goodput import T0, _iso, _pod, _snap


def _words(
    rank: int, *, at: float, productive: float, steps: int, since: int, data: float = 0.0
) -> LastWords:
    """A rank's exit totals (10 s of startup, communication and checkpoint timed, at 0)."""
    ms = round(1000 * productive)
    totals = Totals(round(1000 * at), ms, 10_000, round(1000 * data), 0, 0, 0, since)
    return LastWords(pid=100 + rank, rank=rank, steps=steps, totals=totals)


def _two_ranks_scraped(ledger: GoodputLedger) -> None:
    """w-0 (rank 0, saved 20 steps ago) and w-1 (rank 1, never saved) scraped at T0, 1 s a step."""
    ledger.update(
        pods=[_pod("w-0"), _pod("w-1")],
        answered={
            "w-0": _snap(T0, {"0": {"productive": 90, "startup": 10, "steps": 90, "since": 20}}),
            "w-1": _snap(T0, {"1": {"productive": 90, "startup": 10, "steps": 90, "since": 90, "up": 1.0}}),
        },
    )


def _replaced(ledger: GoodputLedger, finished: list[PodInfo], exited: list[PodInfo]) -> None:
    """w-0b and w-1b take ranks 0 and 1: their processes started at T0+40, 5 s to the first batch."""
    ledger.update(
        pods=[_pod("w-0b"), _pod("w-1b")],
        finished=finished,
        exited=exited,
        answered={
            "w-0b": _snap(T0 + 60, {"0": {"productive": 15, "startup": 5}}),
            "w-1b": _snap(T0 + 60, {"1": {"productive": 15, "startup": 5}}),
        },
    )


def _ended(name: str, words: LastWords, *, phase: str, deleting: bool = False) -> PodInfo:
    down = RestartRecord(count=0, finished_at=None, started_at=None, terminated_at=_iso(T0 + 7))
    pod = dataclasses.replace(_pod(name, phase=phase, restart=down), exit_words=(words,))
    return dataclasses.replace(pod, deleting=deleting)


def test_the_seconds_after_the_last_scrape_count_as_what_they_were_and_the_restart_runs_from_the_end() -> (
    None
):
    """w-1 deleted, w-0 Failed (its peer died), both 6 s after their last scrape: 5 more steps
    each, 1 s of data wait, rank 0 saved again 3 steps before the end."""
    ledger = GoodputLedger()
    _two_ranks_scraped(ledger)
    w0 = _ended("w-0", _words(0, at=T0 + 6, productive=95, steps=95, since=3, data=1), phase="Failed")
    w1 = _ended("w-1", _words(1, at=T0 + 6, productive=95, steps=95, since=95, data=1), phase="Failed")
    _replaced(ledger, finished=[w0], exited=[w0, w1])
    out = ledger.status()
    assert out is not None
    assert out["restarts"] == 2  # each replacement Pod
    # Per rank: from its end (T0+6) to the new process's start (T0+40), its 5 s to the first
    # batch, and the 3 steps since the job's checkpoint at the end (rank 0's newest save); the
    # job's seconds are the mean of its 2 ranks. From the last scrape it read 40 + 5 + 20 = 65.
    assert out["badputSeconds"]["restart"] == pytest.approx(34 + 5 + 3)
    assert out["badputSeconds"]["dataWait"] == pytest.approx(1.0)
    assert out["productiveSeconds"] == pytest.approx(90 + 5 - 3 + 15)
    assert out["elapsedSeconds"] == pytest.approx(100 + 6 + 34 + 20)  # no second twice, none lost


def test_without_exit_totals_the_restart_runs_from_the_last_scrape() -> None:
    ledger = GoodputLedger()
    _two_ranks_scraped(ledger)
    w0 = _pod("w-0", phase="Failed")
    _replaced(ledger, finished=[w0], exited=[])
    out = ledger.status()
    assert out is not None
    assert out["badputSeconds"]["restart"] == pytest.approx(40 + 5 + 20)


@pytest.mark.parametrize(
    ("why", "words"),
    [
        (
            "a figure below the scrape's: not the process it scraped",
            _words(1, at=T0 + 6, productive=3, steps=3, since=3),
        ),
        ("totals taken before the scrape", _words(1, at=T0 - 1, productive=95, steps=95, since=95)),
        ("a rank the pod's scrape had not", _words(2, at=T0 + 6, productive=95, steps=95, since=95)),
    ],
)
def test_exit_totals_that_do_not_continue_the_last_scrape_are_not_counted(why: str, words: LastWords) -> None:
    ledger = GoodputLedger()
    _two_ranks_scraped(ledger)
    w1 = _ended("w-1", words, phase="Running", deleting=True)
    _replaced(ledger, finished=[], exited=[w1])
    out = ledger.status()
    assert out is not None, why
    # w-0 vanished without totals too: both restart from their last scrape (T0).
    assert out["badputSeconds"]["restart"] == pytest.approx(40 + 5 + 20), why
    assert out["productiveSeconds"] == pytest.approx(90 - 20 + 15), why


def test_a_succeeded_pods_last_seconds_count_and_restart_nothing() -> None:
    ledger = GoodputLedger()
    ledger.update(
        pods=[_pod("w-0")],
        answered={"w-0": _snap(T0, {"0": {"productive": 90, "startup": 10, "steps": 90, "since": 90}})},
    )
    done = _ended("w-0", _words(0, at=T0 + 4, productive=93, steps=93, since=1, data=0.5), phase="Succeeded")
    ledger.update(pods=[], finished=[done], exited=[done], answered={})
    ledger.update(pods=[], finished=[done], exited=[done], answered={})  # read once, not twice
    out = ledger.status()
    assert out is not None
    assert (out["restarts"], out["badputSeconds"]["restart"]) == (0, 0.0)
    assert out["productiveSeconds"] == pytest.approx(93.0)
    assert out["elapsedSeconds"] == pytest.approx(100 + 3.5)


def test_an_exit_reading_sums_a_ranks_lines_and_knows_what_was_not_measured() -> None:
    untimed = LastWords(pid=7, steps=4, totals=Totals(int(T0 * 1000), 2_000, 1_000, 500, 250))
    reading = exit_reading([untimed, dataclasses.replace(untimed, pid=8), LastWords(pid=9)])
    assert reading is not None
    assert reading.processes[""]["productive"] == pytest.approx(4.0)
    assert reading.process_count == 2  # two processes without a rank; the line without totals is none
    assert {"communication", "checkpoint"}.isdisjoint(reading.measured)
    assert reading.since == {} and reading.at == pytest.approx(T0)
    assert exit_reading([LastWords(pid=9)]) is None


def _body(name: str, message: str, *, sidecar_message: str = "") -> dict[str, Any]:
    terminated = {"exitCode": 1, "finishedAt": _iso(T0), "message": message}
    return {
        "metadata": {"namespace": "ns", "name": name, "uid": f"uid-{name}", "labels": {"app": "t"}},
        "status": {
            "phase": "Failed",
            "containerStatuses": [{"name": "train", "state": {"terminated": terminated}}],
            "initContainerStatuses": [
                {"name": "dam-probe-install", "state": {"terminated": {"message": message}}},
                {"name": "dam-sidecar", "state": {"terminated": {"message": sidecar_message}}},
            ],
        },
    }


def test_exit_words_are_the_sidecars_lines_else_the_training_containers() -> None:
    probe = _words(0, at=T0, productive=5, steps=5, since=5)
    sidecar = dataclasses.replace(_words(0, at=T0 - 0.1, productive=4.9, steps=5, since=5), pid=0)
    loader_only = LastWords(pid=3, loader_workers=2)
    both = _body("p", probe.line() + loader_only.line(), sidecar_message=sidecar.line())["status"]
    assert exit_words(both) == (sidecar,)  # what its scrapes read, however the processes ended
    alone = _body("p", probe.line() + loader_only.line())["status"]
    assert exit_words(alone) == (probe,)  # a process's own at a clean exit; no init container's
    assert exit_words({"containerStatuses": [{"name": "train", "state": {"running": {}}}]}) == ()


def test_the_registry_keeps_a_deleted_pods_exit_totals_for_the_windows_after_and_forgets_the_oldest(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(reg, "MAX_DEPARTED", 3)
    registry = Registry()
    spec = parse_spec({"selector": {"matchLabels": {"app": "t"}}})
    entry = registry.upsert_profile("ns", "prof", uid="u", generation=1, spec=spec)
    line = _words(0, at=T0, productive=5, steps=5, since=5).line()
    for i in range(5):
        pod = PodInfo.from_body(_body(f"p{i}", line), instrumented=True)
        registry.upsert_pod(pod)
        registry.depart_pod(pod)
    silent = PodInfo.from_body(_body("quiet", "Traceback ..."), instrumented=True)
    registry.upsert_pod(silent)
    registry.depart_pod(silent)
    other = PodInfo.from_body(_body("other", line) | {"metadata": {"namespace": "ns", "name": "other"}}, True)
    registry.depart_pod(other)  # no labels: not the profile's
    assert registry.pod("ns", "p4") is None  # out of the index
    assert [p.name for p in registry.exited_pods_for(entry)] == ["p3", "p4"]  # 3 kept, "other" the 3rd
    ended = PodInfo.from_body(_body("live-failed", line), instrumented=True)
    registry.upsert_pod(ended)  # Failed, still in the API: from the index
    assert "live-failed" in [p.name for p in registry.exited_pods_for(entry)]


def test_a_pod_being_deleted_waits_in_the_ledger_for_its_last_words() -> None:
    """The window runs while w-1 terminates (the kubelet stopping its containers): it is neither
    retired nor counted; the next window has its last body, words in, from the departed."""
    ledger = GoodputLedger()
    _two_ranks_scraped(ledger)
    terminating = dataclasses.replace(_pod("w-1"), deleting=True)
    ledger.update(
        pods=[_pod("w-0")],
        exited=[terminating],
        answered={
            "w-0": _snap(T0 + 10, {"0": {"productive": 100, "startup": 10, "steps": 100, "since": 30}})
        },
        now=T0 + 10,
    )
    assert "w-1" in ledger.pods and not ledger.vacancies
    w1 = _ended("w-1", _words(1, at=T0 + 6, productive=95, steps=95, since=95, data=1), phase="Failed")
    ledger.update(
        pods=[_pod("w-0"), _pod("w-1b")],
        exited=[w1],
        answered={
            "w-0": _snap(T0 + 60, {"0": {"productive": 150, "startup": 10, "steps": 150, "since": 80}}),
            "w-1b": _snap(T0 + 60, {"1": {"productive": 15, "startup": 5}}),
        },
        now=T0 + 60,
    )
    out = ledger.status()
    assert out is not None
    # Rank 1: from its end (T0+6) to w-1b's start (T0+40), 5 s to its first batch, and the
    # progress at risk at its end: the 20 steps since the job's checkpoint at its last scrape,
    # and the 5 it took after (no save of the job seen in between; rank 0's figure of T0+60 is
    # of now, not of rank 1's end). Over the job's 2 ranks.
    assert out["badputSeconds"]["restart"] == pytest.approx((34 + 5 + 25) / 2)
    assert out["badputSeconds"]["dataWait"] == pytest.approx(1 / 2)


def test_a_replacement_reporting_first_ends_the_wait_and_restarts_from_the_last_scrape() -> None:
    ledger = GoodputLedger()
    _two_ranks_scraped(ledger)
    terminating = dataclasses.replace(_pod("w-1"), deleting=True)
    ledger.update(
        pods=[_pod("w-0"), _pod("w-1b")],
        exited=[terminating],
        answered={
            "w-0": _snap(T0 + 60, {"0": {"productive": 150, "startup": 10, "steps": 150, "since": 20}}),
            "w-1b": _snap(T0 + 60, {"1": {"productive": 15, "startup": 5}}),
        },
        now=T0 + 60,
    )
    out = ledger.status()
    assert out is not None and "w-1" not in ledger.pods
    assert out["badputSeconds"]["restart"] == pytest.approx((40 + 5 + 20) / 2)


def test_a_pod_that_never_says_its_last_words_is_retired_after_the_wait() -> None:
    ledger = GoodputLedger()
    _two_ranks_scraped(ledger)
    terminating = dataclasses.replace(_pod("w-1"), deleting=True)
    for at in (T0 + 10, T0 + 60, T0 + 131):
        ledger.update(
            pods=[_pod("w-0")],
            exited=[terminating],
            answered={"w-0": _snap(at, {"0": {"productive": at - T0 + 90, "startup": 10}})},
            now=at,
        )
    assert "w-1" not in ledger.pods  # more than MAX_WAIT_SECONDS (120) after the first wait
    assert [v.key for v in ledger.vacancies] == ["1"]


def test_departed_pods_are_found_by_the_selectors_labels_and_forgotten_from_every_index(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(reg, "MAX_DEPARTED", 2)
    registry = Registry()
    line = _words(0, at=T0, productive=5, steps=5, since=5).line()
    entries = {}
    for job in ("a", "b"):
        spec = parse_spec({"selector": {"matchLabels": {"app": "t", "job": job}}})
        entries[job] = registry.upsert_profile("ns", job, uid=job, generation=1, spec=spec)
    for name, job in (("a-0", "a"), ("b-0", "b"), ("b-1", "b")):
        body = _body(name, line)
        body["metadata"]["labels"] = {"app": "t", "job": job}
        registry.depart_pod(PodInfo.from_body(body, instrumented=True))
    assert [p.name for p in registry.exited_pods_for(entries["a"])] == []  # pushed out, all indexes
    assert [p.name for p in registry.exited_pods_for(entries["b"])] == ["b-0", "b-1"]
    assert registry._departed_index.keys() == {("ns", "app", "t"), ("ns", "job", "b")}

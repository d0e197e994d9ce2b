"""The progress judge (dam_operator.diagnosis.progress): numbers in, status.progress out."""

from __future__ import annotations

from dam_operator.diagnosis.progress import RankPlace, StallSettings, Tracker, judge

S = 1_000_000_000
NOW = 1_800_000_000 * S
FLOOR = StallSettings(after_seconds=30, step_multiple=10)


def rank(r: int, idle_s: float, **more: object) -> RankPlace:
    fields: dict[str, object] = {
        "pod": "",
        "rank": r,
        "steps": 100,
        "step_seconds": 99 * 0.1,  # 0.1 s steps
        "last_batch_ns": int(NOW - idle_s * S),
        "running": True,
    }
    fields.update(more)
    return RankPlace(**fields)  # type: ignore[arg-type]


def test_no_finished_step_is_not_started_however_long_it_takes() -> None:
    first_step = [rank(0, 600, steps=1, step_seconds=0.0), rank(1, 600, steps=1, step_seconds=0.0)]
    assert judge(first_step, NOW, FLOOR).state == "NotStarted"


def test_the_floor_and_the_step_multiple_decide_the_stall() -> None:
    assert judge([rank(0, 29)], NOW, FLOOR).state == "Progressing"
    assert judge([rank(0, 31)], NOW, FLOOR).state == "Stalled"
    slow_steps = rank(0, 31, step_seconds=99 * 5.0)  # 5 s steps: 10 of them is 50 s
    assert judge([slow_steps], NOW, FLOOR).state == "Progressing"
    assert judge([rank(0, 51, step_seconds=99 * 5.0)], NOW, FLOOR).state == "Stalled"


def test_a_rank_that_never_entered_the_collective_the_others_wait_in_is_the_culprit() -> None:
    ranks = [
        rank(0, 40, entered=20, place="collective", detail="all_reduce #20"),
        rank(1, 41, entered=19, place="user-code", frames=("train.py:23 stall_here", "train.py:40 <module>")),
        rank(2, 40, entered=20, place="collective", detail="all_reduce #20"),
    ]
    p = judge(ranks, NOW, FLOOR)
    assert p.state == "Stalled" and p.stalled_seconds == 40.0
    assert p.culprit is not None and (p.culprit.rank, p.culprit.where) == (1, "user-code")
    assert p.culprit.frames == ["train.py:23 stall_here", "train.py:40 <module>"]
    assert p.waiting is not None and (p.waiting.ranks, p.waiting.detail) == (2, "all_reduce #20")
    assert "rank 1 in user-code (train.py:23 stall_here); 2 ranks waiting in collective all_reduce #20" in (
        p.describe()
    )


def test_a_rank_behind_in_an_earlier_collective_is_the_culprit() -> None:
    ranks = [
        rank(0, 40, entered=7, place="collective", detail="all_reduce #7"),
        rank(1, 40, entered=6, place="collective", detail="broadcast #6"),
    ]
    p = judge(ranks, NOW, FLOOR)
    assert p.culprit is not None and (p.culprit.rank, p.culprit.detail) == (1, "broadcast #6")
    assert p.waiting is not None and p.waiting.ranks == 1


def test_a_rank_whose_process_ended_while_the_others_wait_is_named_exited() -> None:
    ranks = [rank(0, 40, entered=5, place="collective"), rank(1, 45, running=False)]
    p = judge(ranks, NOW, FLOOR)
    assert p.culprit is not None and (p.culprit.rank, p.culprit.where) == (1, "exited")


def test_every_rank_at_the_same_collective_names_no_culprit_but_says_who_waits() -> None:
    ranks = [rank(r, 40, entered=9, place="collective", detail="barrier #9") for r in range(4)]
    p = judge(ranks, NOW, FLOOR)
    assert p.state == "Stalled" and p.culprit is None
    assert p.waiting is not None and (p.waiting.ranks, p.waiting.where) == (4, "collective")


def test_a_job_whose_processes_all_ended_is_not_stalled() -> None:
    assert judge([rank(0, 400, running=False)], NOW, FLOOR).state == "Progressing"


def test_since_is_kept_across_evaluations_and_a_stall_dates_from_its_last_step() -> None:
    tracker = Tracker()
    first, changed = tracker.update(judge([rank(0, 1)], NOW, FLOOR), "2027-01-15T08:00:00Z")
    assert changed and first.since == "2027-01-15T08:00:00Z"
    again, changed = tracker.update(judge([rank(0, 2)], NOW, FLOOR), "2027-01-15T08:00:05Z")
    assert not changed and again.since == "2027-01-15T08:00:00Z"
    stalled, changed = tracker.update(judge([rank(0, 31)], NOW, FLOOR), "2027-01-15T08:01:00Z")
    assert changed and stalled.since == stalled.last_step_time and tracker.previous == "Progressing"

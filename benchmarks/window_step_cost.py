"""One window of a profile without pods, in process: ``window_step`` (the scheduler's call: the
profile's state copied, then the window) against ``decide_window`` alone (no copy).

    .venv/bin/python benchmarks/window_step_cost.py [--windows 3000]

What a profile with no pod costs the operator each window (the quiet phase of
``benchmarks/operator_scale.py``), and the share of it that copying the state takes. Prints
microseconds per window for each, alternated twice.
"""

from __future__ import annotations

import argparse
import datetime as dt
import time

from dam_operator.cluster.steps.spec import parse_spec
from dam_operator.cluster.steps.window_step import (
    ProfileState,
    WindowInputs,
    WindowSettings,
    decide_window,
    window_step,
)
from dam_operator.diagnosis.hysteresis import Stabilizer

WHEN = dt.datetime(2026, 12, 1, tzinfo=dt.UTC)


def _per_window(mode: str, windows: int) -> float:
    spec = parse_spec({"selector": {"matchLabels": {"app": "t"}}})
    settings = WindowSettings(webhook_enabled=True, max_baseline_seconds=600.0)
    state = ProfileState(stabilizer=Stabilizer(confirm_windows=1), baselines={})

    def one(i: int) -> None:
        nonlocal state
        inputs = WindowInputs(
            spec=spec,
            pods=[],
            results={},
            settings=settings,
            status={},
            generation=1,
            when=WHEN + dt.timedelta(seconds=30 * i),
        )
        if mode == "window_step":
            state = window_step(state, inputs)[0]
        else:
            decide_window(inputs, state)

    for i in range(50):
        one(i)
    started = time.perf_counter()
    for i in range(windows):
        one(50 + i)
    return (time.perf_counter() - started) / windows * 1e6


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--windows", type=int, default=3000)
    args = parser.parse_args(argv)
    for mode in ("window_step", "decide_window", "window_step", "decide_window"):
        print(f"{mode:14s} {_per_window(mode, args.windows):6.0f} us per window")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

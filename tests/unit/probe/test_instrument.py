"""``dam_probe.instrument``: counters, publishing, pass-through, errors, fork safety."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import dam_probe
from dam_probe._core import Probe, batch_size_of
from dam_probe.layout import decode, probe_files, read_file

from .conftest import python_env, run_python


class SlowSource:
    """An iterable whose ``next()`` blocks ``delay`` seconds per item."""

    def __init__(self, n: int, delay: float) -> None:
        self.n = n
        self.delay = delay
        self.label = "slow"

    def __iter__(self) -> Iterator[int]:
        for i in range(self.n):
            time.sleep(self.delay)
            yield i

    def __len__(self) -> int:
        return self.n


def _train(iterable: object, work: float) -> int:
    count = 0
    for _ in iterable:  # type: ignore[attr-defined]
        time.sleep(work)
        count += 1
    return count


def test_slow_loader_and_equal_work_give_a_wait_ratio_near_one_half(probe: Probe) -> None:
    assert _train(dam_probe.instrument(SlowSource(30, 0.004)), work=0.004) == 30
    assert probe.step.steps == 30
    assert 0.35 < probe.step.wait_ns / probe.step.step_ns < 0.65
    assert probe.step.wait_ns >= 30 * 0.004e9


def test_fast_loader_gives_a_wait_ratio_near_zero(probe: Probe) -> None:
    _train(dam_probe.instrument(list(range(30))), work=0.003)
    assert probe.step.steps == 30
    assert probe.step.wait_ns / probe.step.step_ns < 0.05
    assert probe.step.step_ns >= 29 * 0.003e9


def test_time_between_epochs_is_not_counted_as_step_time(probe: Probe) -> None:
    loader = dam_probe.instrument(SlowSource(5, 0.002))
    start = time.perf_counter_ns()
    _train(loader, work=0.002)
    time.sleep(0.2)  # evaluation, checkpointing: outside any step
    _train(loader, work=0.002)
    elapsed = time.perf_counter_ns() - start
    assert probe.step.steps == 10
    assert probe.step.step_ns < elapsed - 0.15e9
    assert probe.step.step_ns >= 10 * 0.004e9


def test_counters_published_to_the_file_equal_the_in_memory_counters(probe: Probe, tmp_path: Path) -> None:
    _train(dam_probe.instrument(SlowSource(8, 0.001)), work=0.0)
    probe.close()
    (path,) = probe_files(str(tmp_path / "probes"))
    rec = read_file(path)
    assert (rec.steps, rec.wait_ns, rec.step_ns, rec.closed) == (
        8,
        probe.step.wait_ns,
        probe.step.step_ns,
        True,
    )


def test_publishing_is_throttled_to_the_interval(probe: Probe, tmp_path: Path) -> None:
    probe.interval_ns = 20_000_000
    start = time.perf_counter_ns()
    _train(dam_probe.instrument(range(200)), work=0.0005)
    elapsed = time.perf_counter_ns() - start
    (path,) = probe_files(str(tmp_path / "probes"))
    with open(path, "rb") as fh:
        sequence, rec = decode(fh.read())
    publishes = sequence // 2
    assert rec.steps > 0
    assert 1 <= publishes <= elapsed // probe.interval_ns + 2
    assert publishes < 200 / 4  # far fewer writes than batches


def test_nothing_is_written_before_the_first_batch(probe: Probe, tmp_path: Path) -> None:
    loader = dam_probe.instrument(SlowSource(3, 0.0))
    assert probe_files(str(tmp_path / "probes")) == []
    it = iter(loader)
    assert probe_files(str(tmp_path / "probes")) == []
    next(it)
    assert len(probe_files(str(tmp_path / "probes"))) == 1


def test_without_probe_dir_instrument_returns_the_iterable_itself(
    probe: Probe, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("DAM_PROBE_DIR")
    source = SlowSource(3, 0.0)
    assert dam_probe.instrument(source) is source
    assert _train(dam_probe.instrument(source), 0.0) == 3
    assert probe.step.steps == 0


def test_disable_variable_turns_instrument_into_a_pass_through(
    probe: Probe, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("DAM_PROBE_DISABLE", "1")
    source = [1, 2, 3]
    assert dam_probe.instrument(source) is source
    assert not (tmp_path / "probes").exists()


def test_wrapper_passes_len_and_attributes_through(probe: Probe) -> None:
    source = SlowSource(4, 0.0)
    loader = dam_probe.instrument(source)
    assert len(loader) == 4  # type: ignore[arg-type]
    assert loader.label == "slow"  # type: ignore[attr-defined]
    assert list(loader) == [0, 1, 2, 3]


def test_an_iterator_is_returned_as_an_iterator(probe: Probe) -> None:
    it = dam_probe.instrument(iter([5, 6]))
    assert next(it) == 5
    assert next(it) == 6
    with pytest.raises(StopIteration):
        next(it)
    assert probe.step.steps == 2


def test_nested_instrumentation_counts_each_batch_once(probe: Probe) -> None:
    inner = dam_probe.instrument(SlowSource(6, 0.001))
    outer = dam_probe.instrument(inner)
    assert _train(outer, 0.0) == 6
    assert probe.step.steps == 6


def test_exception_from_the_loader_reaches_the_training_loop_and_counting_goes_on(probe: Probe) -> None:
    def broken() -> Iterator[int]:
        yield 1
        raise KeyError("bad sample")

    with pytest.raises(KeyError, match="bad sample"):
        _train(dam_probe.instrument(broken()), 0.0)
    _train(dam_probe.instrument([1, 2]), 0.0)
    assert probe.step.steps == 3
    assert not probe.disabled


def test_declared_flops_and_batch_size_are_published(probe: Probe, tmp_path: Path) -> None:
    class Tensor:
        shape = (16, 3, 32, 32)

    dam_probe.set_flops_per_step(3.5e12)
    _train(dam_probe.instrument([(Tensor(), Tensor())] * 3), 0.0)
    probe.close()
    (path,) = probe_files(str(tmp_path / "probes"))
    rec = read_file(path)
    assert (rec.flops_per_step, rec.batch_size) == (3.5e12, 16)


@pytest.mark.parametrize("bad", [-1.0, float("nan"), float("inf")])
def test_invalid_flops_per_step_is_refused(probe: Probe, bad: float) -> None:
    with pytest.raises(ValueError, match="flops_per_step"):
        dam_probe.set_flops_per_step(bad)


def test_batch_size_is_read_from_the_first_tensor_like_only() -> None:
    class T:
        def __init__(self, *shape: int) -> None:
            self.shape = shape

    assert batch_size_of(T(8, 2)) == 8
    assert batch_size_of([T(4), T(9)]) == 4
    assert batch_size_of({"input_ids": T(12, 512), "labels": T(12)}) == 12
    assert batch_size_of(((T(3),),)) == 3
    assert batch_size_of(T()) == 0  # a scalar
    assert batch_size_of(["a", "b"]) == 0
    assert batch_size_of(None) == 0
    assert batch_size_of([]) == 0


def test_publish_failure_disables_the_probe_with_one_stderr_line(
    probe: Probe, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("DAM_PROBE_DIR", str(blocker / "sub"))
    assert _train(dam_probe.instrument(range(50)), 0.0) == 50
    assert _train(dam_probe.instrument(range(50)), 0.0) == 50
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("dam-probe: disabled: cannot create ")
    assert probe.disabled


UNWRITABLE = """
import dam_probe, sys
n = 0
for epoch in range(3):
    for batch in dam_probe.instrument(range(1000)):
        n += 1
print("trained", n)
"""


def test_unwritable_probe_dir_prints_one_line_and_training_completes(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    result = run_python(UNWRITABLE, python_env(DAM_PROBE_DIR=str(blocker / "probes")))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "trained 3000"
    assert result.stderr.count("\n") == 1
    assert result.stderr.startswith("dam-probe: disabled: cannot create ")


FORK = """
import os, sys, dam_probe
from dam_probe.layout import probe_path, read_file
d = os.environ["DAM_PROBE_DIR"]
for _ in dam_probe.instrument(range(5)):
    pass
pid = os.fork()
if pid == 0:
    for _ in dam_probe.instrument(range(1000)):
        pass
    dam_probe.PROBE.close()
    os._exit(0)
os.waitpid(pid, 0)
before = read_file(probe_path(d, os.getpid()))
dam_probe.PROBE.close()
parent = read_file(probe_path(d, os.getpid()))
child = read_file(probe_path(d, pid))
print(before.steps <= 5, before.closed, parent.pid == os.getpid(), parent.steps, parent.closed)
print(child.pid == pid, child.steps, child.closed, len(os.listdir(d)))
"""


def test_forked_child_never_writes_the_parents_file(tmp_path: Path) -> None:
    result = run_python(FORK, python_env(DAM_PROBE_DIR=str(tmp_path)))
    assert result.returncode == 0, result.stderr
    # The parent's file holds the parent's 5 batches; the child counted from zero in its own file.
    assert result.stdout.split() == ["True", "False", "True", "5", "True", "True", "1000", "True", "2"]

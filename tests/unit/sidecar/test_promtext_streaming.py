"""The exposition reader: line by line, only the series asked for, bounded lines and series, strict values.

``dam evaluate`` reads snapshot files with ``read_snapshot`` and the operator parses
sidecar scrapes with ``parse_snapshot``; both go through ``iter_samples``, so garbage is
one ``PromParseError`` naming the line, whichever way it came in (hostile-input set,
issue 17).
"""

from __future__ import annotations

import io
import math
import random
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import pytest

from dam_contract import names as n
from dam_contract.snapshot import (
    MAX_LINE_CHARACTERS,
    ParseStats,
    PromParseError,
    TooManySeriesError,
    iter_samples,
    labels_of,
    parse,
    parse_snapshot,
    read_snapshot,
)

SIDECAR_TEXT = f"""# HELP {n.STEPS_TOTAL} Steps.
# TYPE {n.STEPS_TOTAL} counter
{n.STEPS_TOTAL} 120
{n.GPU_UTILIZATION_RATIO}{{gpu="0",uuid="GPU-0"}} 0.5
http_requests_total{{code="200"}} 7
go_goroutines 12
"""


def is_dam(name: str) -> bool:
    return name.startswith("dam_")


def test_only_the_series_asked_for_are_kept_and_the_rest_is_counted() -> None:
    stats = ParseStats()
    snap = read_snapshot(io.StringIO(SIDECAR_TEXT), "s.prom", keep=is_dam, stats=stats)
    assert snap.names() == {n.STEPS_TOTAL, n.GPU_UTILIZATION_RATIO}
    assert (stats.samples, stats.kept) == (4, 2)
    assert stats.dropped_names == ["http_requests_total", "go_goroutines"]


def test_samples_come_out_one_at_a_time_as_lines_are_read() -> None:
    pulled = 0

    def lines() -> Iterator[str]:
        nonlocal pulled
        for i in range(1_000_000):
            pulled += 1
            yield f'dam_x_total{{i="{i}"}} {i}'

    first = next(iter_samples(lines(), "gen"))
    assert first.value == 0.0
    assert pulled == 1


def test_a_file_of_one_endless_line_is_refused_without_reading_it_whole(tmp_path: Path) -> None:
    path = tmp_path / "one-line.prom"
    path.write_text('dam_steps_total{a="' + "x" * 20_000_000)
    tracemalloc.start()
    try:
        with open(path, encoding="utf-8", newline="\n") as fh, pytest.raises(PromParseError) as err:
            read_snapshot(fh, str(path))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert str(err.value) == f"{path}:1: line longer than {MAX_LINE_CHARACTERS} characters"
    assert peak < 2 * 1024 * 1024  # the 20 MB line was never held


def test_memory_follows_the_kept_series_not_the_file(tmp_path: Path) -> None:
    path = tmp_path / "big.prom"
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(SIDECAR_TEXT)
        for i in range(100_000):
            fh.write(f'node_filesystem_avail_bytes{{device="/dev/sd{i}",mountpoint="/m/{i}"}} {i}\n')
    tracemalloc.start()
    try:
        with open(path, encoding="utf-8", newline="\n") as fh:
            snap = read_snapshot(fh, str(path), keep=is_dam)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(snap) == 2
    assert peak < path.stat().st_size / 8, (peak, path.stat().st_size)


def test_more_kept_series_than_the_cap_is_an_error_naming_line_and_cap() -> None:
    text = "".join(f'dam_gpu_utilization_ratio{{gpu="{i}"}} 0.5\n' for i in range(10))
    text = "other_metric 1\n" * 50 + text
    with pytest.raises(TooManySeriesError) as err:
        parse_snapshot(text, "flood", keep=is_dam, max_series=4)
    assert err.value.line == 55
    assert err.value.limit == 4
    assert str(err.value) == "flood:55: more than 4 series to keep (cap reached at dam_gpu_utilization_ratio)"
    assert len(parse_snapshot(text, "flood", keep=is_dam, max_series=10)) == 10


def test_a_series_that_is_not_kept_is_still_checked() -> None:
    with pytest.raises(PromParseError, match=r"^f:2: malformed label set"):
        parse_snapshot('dam_steps_total 1\nother{a="1",,} 2\n', "f", keep=is_dam)
    with pytest.raises(PromParseError, match=r"^f:1: value 'x' is not a number"):
        parse_snapshot("other x\n", "f", keep=is_dam)


@pytest.mark.parametrize("raw", ["1_000", "0x10", "infinity", "1e", "--1", "1.2.3", "nan1", "１"])
def test_values_prometheus_would_refuse_are_refused(raw: str) -> None:
    with pytest.raises(PromParseError, match="is not a number"):
        parse(f"dam_steps_total {raw}\n", "v")


@pytest.mark.parametrize(
    ("raw", "value"),
    [("12", 12.0), ("-1.5e+06", -1.5e6), (".5", 0.5), ("3.", 3.0), ("+Inf", math.inf), ("-Inf", -math.inf)],
)
def test_values_of_the_exposition_format_are_read_as_written(raw: str, value: float) -> None:
    (sample,) = parse(f"dam_steps_total {raw}\n")
    assert sample.value == value


def test_nan_is_returned_for_the_reader_to_judge() -> None:
    (sample,) = parse("dam_steps_total NaN\n")
    assert math.isnan(sample.value)


def test_only_newline_ends_a_line_so_label_values_may_hold_other_breaks() -> None:
    text = 'dam_gpu_info{name="A\u2028B\rC\x0cD"} 1\r\ndam_steps_total 2\n'
    samples = parse(text)
    assert samples[0].labels == labels_of({"name": "A\u2028B\rC\x0cD"})
    with open_text(text) as fh:
        assert [s.value for s in read_snapshot(fh, "f").samples(n.STEPS_TOTAL)] == [2.0]


def open_text(text: str) -> io.StringIO:
    return io.StringIO(text, newline="\n")


def test_label_values_are_unescaped_in_one_pass() -> None:
    (sample,) = parse('m{a="x\\\\ny",b="q\\"q",c="l\\nl",d="nul\x00"} 1\n')
    assert sample.label("a") == "x\\ny"
    assert sample.label("b") == 'q"q'
    assert sample.label("c") == "l\nl"
    assert sample.label("d") == "nul\x00"


def test_a_label_value_may_hold_braces_and_commas() -> None:
    (sample,) = parse('m{a="}, {b=\\"1\\"}",c="2",} 3 1700000000000\n')
    assert sample.labels == labels_of({"a": '}, {b="1"}', "c": "2"})
    assert sample.value == 3.0


def test_the_newest_sample_timestamp_is_recorded() -> None:
    stats = ParseStats()
    parse_snapshot(
        "dam_a_total 1 1700000000000\ndam_b_total 1 1700000005000\nother 1 1800000000000\n",
        keep=is_dam,
        stats=stats,
    )
    assert stats.newest_timestamp_ms == 1_700_000_005_000


@pytest.mark.parametrize(
    "line",
    [
        'm{a="x"' + " " * 60_000 + "X} 1",
        'm{a="x",' + " " * 60_000 + "X} 1",
        "m{" + 'a="b",' * 10_000 + " 1",
        "m{" + 'a="b" ' * 10_000 + "} 1",
        'm{a="' + "\\\\" * 30_000 + " 1",
        "m 1" + " " * 60_000 + "2 3",
    ],
    ids=["blanks-after-pair", "blanks-after-comma", "pairs-unclosed", "pairs-no-commas", "escapes", "blanks"],
)
def test_hostile_lines_are_refused_in_time_linear_in_their_length(line: str) -> None:
    started = time.monotonic()
    with pytest.raises(PromParseError):
        parse(line, "h")
    # 60,000 blanks after a label pair took a backtracking grammar 88 s; linear is milliseconds.
    assert time.monotonic() - started < 5


def test_random_garbage_gives_parse_errors_never_anything_else() -> None:
    rng = random.Random(17)
    alphabet = [*'a_:{}=",\\ \t1.e-+NaInf#\r\x00\u2028', 'x="', '"}', " 1", "\n"]
    for _ in range(3_000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.choice([3, 20, 200])))
        if rng.random() < 0.5:
            text = "m{" + text
        try:
            parse(text, "fuzz")
            with open_text(text) as fh:
                read_snapshot(fh, "fuzz", keep=is_dam, max_series=3)
        except PromParseError as exc:
            assert str(exc).startswith("fuzz:")

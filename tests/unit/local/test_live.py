"""`dam run`'s live verdict: the status line's drawing rules and the change filter (pure parts)."""

from __future__ import annotations

from dam_operator.diagnosis.model import Axis, Bottleneck, Regime, Verdict, WindowMetrics
from dam_operator.local.live import CLEAR_LINE, ChangeFilter, StatusLine, fit, live_mode, progress_text


def verdict(axis: Axis, regime: Regime, confidence: float = 0.8) -> Verdict:
    return Verdict(
        bottleneck=Bottleneck(
            axis=axis, regime=regime, lever="x", lever_detail="x", confidence=confidence, evidence=["e"]
        ),
        metrics=WindowMetrics(),
    )


class Terminal:
    def __init__(self, columns: int = 80) -> None:
        self.columns = columns
        self.written: list[str] = []

    def write(self, text: str) -> None:
        self.written.append(text)


def test_progress_says_waiting_then_warming_up_with_the_steps_so_far() -> None:
    assert "waiting for the first training step" in progress_text(1.0, 0, 10)
    text = progress_text(3.0, 42, 10)
    assert "warming up: 42 steps so far" in text
    assert "after 10s of training" in text
    assert "1 step so far" in progress_text(3.0, 1, 10)


def test_auto_is_a_status_line_on_a_terminal_and_change_lines_elsewhere() -> None:
    assert live_mode("auto", stderr_is_terminal=True) == "line"
    assert live_mode("auto", stderr_is_terminal=False) == "changes"
    assert live_mode("never", stderr_is_terminal=True) == "never"


def test_status_line_is_redrawn_in_place_and_never_ends_a_line() -> None:
    term = Terminal()
    status = StatusLine(term.write, lambda: term.columns)
    status.show("dam: one")
    status.show("dam: one")  # unchanged: nothing written
    status.show("dam: two")
    assert term.written == [CLEAR_LINE + "dam: one", CLEAR_LINE + "dam: two"]
    assert not any("\n" in w for w in term.written)


def test_status_line_is_cleared_before_the_commands_output_and_redrawn_after_a_full_line() -> None:
    term = Terminal()
    status = StatusLine(term.write, lambda: term.columns)
    status.show("dam: status")
    status.before_output()
    status.after_output(b"epoch 1\r\n")
    assert term.written == [CLEAR_LINE + "dam: status", CLEAR_LINE, CLEAR_LINE + "dam: status"]


def test_status_line_waits_while_the_command_has_a_line_half_written() -> None:
    term = Terminal()
    status = StatusLine(term.write, lambda: term.columns)
    status.show("dam: a")
    status.before_output()
    status.after_output(b"loss: ")  # a progress bar of its own, no newline yet
    status.show("dam: b")
    assert term.written == [CLEAR_LINE + "dam: a", CLEAR_LINE], "nothing drawn over the command's line"
    status.before_output()
    status.after_output(b"0.5\n")
    assert term.written[-1] == CLEAR_LINE + "dam: b"


def test_close_removes_the_status_line() -> None:
    term = Terminal()
    status = StatusLine(term.write, lambda: term.columns)
    status.show("dam: a")
    status.close()
    assert term.written[-1] == CLEAR_LINE


def test_a_long_status_line_is_cut_to_one_row() -> None:
    assert len(fit("x" * 200, 40)) == 39
    assert fit("short", 40) == "short"


def test_change_filter_passes_the_first_verdict_and_then_only_changes_of_axis_or_regime() -> None:
    changes = ChangeFilter()
    seen = [
        changes.changed(v)
        for v in (
            verdict(Axis.DATA, Regime.INPUT_BOUND),
            verdict(Axis.DATA, Regime.INPUT_BOUND, confidence=0.5),  # same regime, other figures
            verdict(Axis.MACHINE, Regime.COMPUTE_BOUND),
            verdict(Axis.MACHINE, Regime.COMPUTE_BOUND),
            verdict(Axis.DATA, Regime.INPUT_BOUND),
        )
    ]
    assert seen == [True, False, True, False, True]

"""The progress line fits the terminal: in an 80-column terminal a wider line wraps at every redraw,
so the screen scrolls instead of updating in place and the ETA at the end never shows."""

from __future__ import annotations

import io

import pytest

from rl_moe.continual.progress import ProgressLine, fit_line, terminal_columns

LABEL = "[task 2/10 push-wall-v3]"


def test_a_wide_terminal_or_a_log_file_gets_the_whole_line() -> None:
    whole = fit_line(LABEL, 123_456, 1_000_000, 2345.4, "1:23:45", "update 3/10", None)
    assert whole == f"{LABEL} [##----------------------]   123,456/1,000,000     2345 steps/s  run ETA 1:23:45  update 3/10"
    assert fit_line(LABEL, 123_456, 1_000_000, 2345.4, "1:23:45", "update 3/10", len(whole) + 1) == whole


@pytest.mark.parametrize(
    ("columns", "want"),
    [
        (80, f"{LABEL} [#-----------] 123,456/1,000,000 2345/s ETA >=1:23:45"),
        (60, "[task 2/10] 123,456/1,000,000 2345/s ETA >=1:23:45"),
        (40, "[task 2/10] ETA >=1:23:45"),
        (20, "ETA >=1:23:45"),
    ],
)
def test_a_narrow_terminal_keeps_the_eta(columns: int, want: str) -> None:
    got = fit_line(LABEL, 123_456, 1_000_000, 2345.4, ">=1:23:45", "update 3/10", columns)
    assert got == want and len(got) < columns


def test_the_drawn_line_never_reaches_the_last_column() -> None:
    out = io.StringIO()
    line = ProgressLine(LABEL, task_start=0, task_steps=1_000_000, stream=out, interval=0.0, columns=lambda: 80)
    line.model = None  # type: ignore[assignment]  # SB3 sets it in init_callback
    line.num_timesteps = 0
    line._on_training_start()
    for step in (10, 999_999):
        line.num_timesteps = step
        line._on_step()
    line.on_epoch(2, 10)
    line._on_training_end()
    drawn = [d for d in out.getvalue().split("\r") if d]
    assert len(drawn) == 5 and all(len(d.rstrip("\n")) < 80 and "ETA" in d for d in drawn), drawn
    assert drawn[-1].endswith("\n") and "999,999/1,000,000" in drawn[-1]


def test_only_a_terminal_has_a_width() -> None:
    assert terminal_columns(io.StringIO()) is None

"""tools/rebuild_reports.py: the committed reports' figures and HTML are rebuilt by one command."""

from __future__ import annotations

from pathlib import Path

import pytest

from tools import rebuild_reports

RESULTS = Path(__file__).resolve().parents[1] / "results"


def table(md: str, title: str) -> list[str]:
    """The table rows of a report's ``### title`` section (captions may change with the code)."""
    start = md.index(f"### {title}")
    end = md.find("\n#", start + 1)
    return [line for line in md[start : end if end != -1 else None].splitlines() if line.startswith("|")]


def test_every_study_folder_and_report_exists() -> None:
    for study in rebuild_reports.STUDIES:
        assert (RESULTS / study / "report" / "report.md").is_file(), study


def test_rebuild_draws_figures_and_reproduces_the_committed_tables(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    study = "sphere-rl/paper"  # one run: the smallest study
    assert rebuild_reports.main([study, "--into", str(tmp_path), "--reps", "100"]) == 0
    out = tmp_path / study / "report"
    assert (out / "report.html").is_file() and list(out.glob("*.png"))
    rebuilt, committed = (out / "report.md").read_text(), (RESULTS / study / "report" / "report.md").read_text()
    assert table(rebuilt, "Per-task success") == table(committed, "Per-task success") != []


def test_unknown_study_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert rebuild_reports.main(["no-such-study"]) == 2
    assert "valid choices" in capsys.readouterr().err

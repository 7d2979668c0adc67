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


def test_readme_embeds_the_figure_the_slice_report_draws(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    readme = (RESULTS.parent / "README.md").read_text()
    for study, (_, target) in rebuild_reports.README_FIGURES.items():
        assert f"]({target})" in readme and (RESULTS.parent / target).is_file(), target
        assert rebuild_reports.main([study, "--into", str(tmp_path), "--reps", "100"]) == 0
        drawn = tmp_path / target
        head = drawn.read_bytes()[:24]
        assert head[:8] == b"\x89PNG\r\n\x1a\n"
        width, height = int.from_bytes(head[16:20], "big"), int.from_bytes(head[20:24], "big")
        assert 400 <= width <= 1200 and 300 <= height <= 1000, (width, height)  # modest: a README figure
        assert drawn.stat().st_size < 300_000
        assert drawn.read_bytes() == (tmp_path / study / "report" / rebuild_reports.README_FIGURES[study][0]).read_bytes()


def test_a_report_without_the_readme_figure_is_an_error(tmp_path: Path) -> None:
    study = next(iter(rebuild_reports.README_FIGURES))
    (tmp_path / study / "report").mkdir(parents=True)
    with pytest.raises(FileNotFoundError, match="README.md embeds"):
        rebuild_reports.copy_readme_figure(study, tmp_path)
    assert rebuild_reports.copy_readme_figure("sphere-rl/paper", tmp_path) is None

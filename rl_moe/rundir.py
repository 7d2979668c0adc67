"""The run folder's layout: every file name of a run lives in :class:`RunDir`.

::

    <run>/config.json                                the resolved RunConfig
    <run>/results.json                               results (schema in docs/continual.md)
    <run>/probe_states.pt                            the held-out probe batch (N, obs_dim)
    <run>/tb/                                        TensorBoard event files
    <run>/checkpoints/task_<idx:02d>_<task>.zip      SB3 checkpoint of each finished task
                      task_<idx:02d>_<task>.regularizers.pt    the regularizers' state
                      task_<idx:02d>_<task>.state.pt           generators and counters (rng.py)
                      task_<idx:02d>_<task>.vecnormalize.pkl   VecNormalize statistics, if used
                      in_task.pkl                      the unfinished task's last rollout boundary (PPO)
    <run>/sweep.log                                  output of a trial run by rl_moe.sweep
    <run>/.lock                                      held by the process writing the run (its PID)
    <run>/reroute-<router>-a<alpha>.json             re-evaluations by rl_moe.evaluate
    <run>/positions-<N>.json                         task checkpoints scored on N held-out positions (rl_moe.positions)
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

#: The held-out probe batch of a run (written by :mod:`rl_moe.diagnostics.probe`); named here,
#: with the folder's other files, so nothing below the CLI reaches up for it.
PROBE_FILE = "probe_states.pt"


class RunDir:
    """A run folder (existing or not) and the paths of its files.

    :param path: the folder
    """

    CONFIG = "config.json"
    RESULTS = "results.json"
    TB = "tb"
    CHECKPOINTS = "checkpoints"
    SWEEP_LOG = "sweep.log"
    LOCK = ".lock"

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    @property
    def config(self) -> Path:
        return self.path / self.CONFIG

    @property
    def results(self) -> Path:
        return self.path / self.RESULTS

    @property
    def tb(self) -> Path:
        return self.path / self.TB

    @property
    def probe_states(self) -> Path:
        """The probe batch, under the name the diagnostics' probe callback uses."""

        return self.path / PROBE_FILE

    @property
    def lock(self) -> Path:
        return self.path / self.LOCK

    def stale_temp_files(self) -> list[Path]:
        """Temp files of interrupted atomic writes (``.<name>.<random>.tmp`` in the folder and in
        ``checkpoints/``); a kill -9 mid-write leaves them (a CW10 checkpoint's is ~19 MB)."""
        return sorted(p for folder in (self.path, self.path / self.CHECKPOINTS) for p in folder.glob(".?*.*.tmp") if p.is_file())

    @property
    def sweep_log(self) -> Path:
        return self.path / self.SWEEP_LOG

    def reroute(self, router: str, alpha: float) -> Path:
        """``reroute-<router>-a<alpha>.json``: a re-evaluation with a training-free router."""
        return self.path / f"reroute-{router}-a{alpha:g}.json"

    @property
    def in_task(self) -> Path:
        """The in-task checkpoint of the unfinished task (:mod:`rl_moe.continual.intask`)."""
        return self.path / self.CHECKPOINTS / "in_task.pkl"

    def positions(self, heldout: int) -> Path:
        """``positions-<N>.json``: the task checkpoints scored on N held-out positions."""
        return self.path / f"positions-{heldout}.json"

    def positions_files(self) -> dict[int, Path]:
        """Every ``positions-<N>.json`` of the folder, by N."""
        found = {}
        for p in self.path.glob("positions-*.json"):
            n = p.stem.removeprefix("positions-")
            if n.isdecimal() and n.isascii() and p.is_file():
                found[int(n)] = p
        return dict(sorted(found.items()))

    def checkpoint(self, index: int, task: str) -> Path:
        """``checkpoints/task_<idx:02d>_<task>.zip``: one SB3 checkpoint per finished task."""
        return self.path / self.CHECKPOINTS / f"task_{index:02d}_{task}.zip"

    @staticmethod
    def regularizer_state(checkpoint: Path) -> Path:
        """``task_<idx:02d>_<task>.regularizers.pt`` beside a checkpoint: the regularizers' state."""
        return checkpoint.with_suffix(".regularizers.pt")

    @staticmethod
    def training_state(checkpoint: Path) -> Path:
        """``task_<idx:02d>_<task>.state.pt`` beside a checkpoint (:mod:`rl_moe.continual.rng`)."""
        return checkpoint.with_suffix(".state.pt")

    @staticmethod
    def vecnormalize(checkpoint: Path) -> Path:
        """``task_<idx:02d>_<task>.vecnormalize.pkl`` beside a checkpoint."""
        return checkpoint.with_suffix(".vecnormalize.pkl")

    def foreign_entries(self) -> list[str]:
        """The folder's entries that no run writes (the layout above; a stale temp file of an
        interrupted write counts as the run's), sorted; empty for a run folder, an empty folder
        or none."""
        if not self.path.is_dir():
            return []
        own = {self.CONFIG, self.RESULTS, self.TB, self.CHECKPOINTS, self.SWEEP_LOG, self.LOCK, PROBE_FILE}
        stale = {p.name for p in self.stale_temp_files() if p.parent == self.path}
        return sorted(
            p.name for p in self.path.iterdir()
            if p.name not in own | stale and not (p.name.startswith(("reroute-", "positions-")) and p.name.endswith(".json"))
        )  # fmt: skip


def check_new_run_folder(path: str | Path, flag: str = "--run-dir") -> None:
    """``path`` may hold a new run: it is new, empty, or a run folder (whose files a run owns).
    A folder of the user's own files is refused, so that a run does not start beside them.

    :raises ValueError: one line naming the folder, a few of its files, and the valid choices
    """
    run = RunDir(path)
    foreign = [] if run.config.is_file() else run.foreign_entries()  # a run's folder may hold the user's notes
    if foreign:
        shown = ", ".join(foreign[:3]) + (f" and {len(foreign) - 3} more" if len(foreign) > 3 else "")
        raise ValueError(
            f"{flag} {str(path)!r} is not empty and not a run folder (it holds {shown}); "
            "give a new or empty folder, or a run folder to resume"
        )


def check_writable_folder(path: str | Path, flag: str) -> None:
    """``path`` can hold a run folder: it is a folder or can be made one, and is writable.

    :param flag: the option that named it, for the message (``--run-dir``, ``--out``)
    :raises ValueError: one line naming the path and what is wrong
    """

    if not str(path).strip():  # Path("") is the current folder: an empty value is a mistake, not a choice
        raise ValueError(f"{flag} is empty; give a folder (the runs root defaults to runs)")
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise ValueError(f"{flag} {str(path)!r} is a file, not a folder")
    # The nearest existing ancestor decides whether the folders below can be made.
    ancestor = p
    while not ancestor.exists():
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise ValueError(f"{flag} {str(path)!r} lies under {str(ancestor)!r}, which is a file, not a folder")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise ValueError(f"{flag} {str(path)!r}: no permission to write in {str(ancestor)!r}")
    # Permission bits do not tell the whole story (root may write anywhere, yet /proc and /sys
    # refuse new folders; a read-only mount refuses everyone): make a folder there and remove it.
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".rl_moe-write-check-", dir=ancestor))
    except OSError as exc:
        raise ValueError(f"{flag} {str(path)!r}: cannot make a folder in {str(ancestor)!r} ({exc.strerror or exc})") from None

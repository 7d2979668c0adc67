"""Copy the compact part of run folders into results/: what the report and the docs need.

    python -m tools.collect_runs ~/rl_moe-runs/mw3easy results/mw3easy

Keeps ``config.json``, ``results.json``, the TensorBoard events (``tb/``), the probe batch
(``probe_states.pt``, 40 kB), ``sweep.log`` and the held-out scores of ``python -m
rl_moe.positions`` (``positions-<N>.json``); leaves out checkpoints (19 MB each on CW10).
Runs still in progress are copied as they stand (their results.json counts the finished tasks).
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

from rl_moe.rundir import RunDir

KEEP = ("config.json", "results.json", "probe_states.pt", "sweep.log")


def collect(src: Path, dst: Path) -> list[Path]:
    """Copy every run folder under ``src`` (a folder holding config.json) to the same place under ``dst``."""
    copied = []
    for config in sorted(src.rglob("config.json")):
        run = config.parent
        out = dst / run.relative_to(src)
        if out.exists():
            shutil.rmtree(out)
        out.mkdir(parents=True)
        for name in KEEP:
            if (run / name).is_file():
                shutil.copy2(run / name, out / name)
        for scores in RunDir(run).positions_files().values():
            shutil.copy2(scores, out / scores.name)
        if (run / "tb").is_dir():
            shutil.copytree(run / "tb", out / "tb")
        copied.append(out)
    return copied


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("src", type=Path)
    p.add_argument("dst", type=Path)
    args = p.parse_args()
    for out in collect(args.src, args.dst):
        print(out)


if __name__ == "__main__":
    main()

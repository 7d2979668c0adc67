"""How true is the progress line's ETA? Run a command of ``python -m rl_moe.crl``, time-stamp every
frame of its progress line, and compare the ETA shown at 25%, 50% and 75% of the run's wall time
with the time that was actually left (docs/continual.md, "Progress"; README quick start).

    python benchmarks/eta_under_load.py                  # the README's quick start
    python benchmarks/eta_under_load.py --busy 2         # beside two busy processes it starts
    python benchmarks/eta_under_load.py -- --suite smoke --tasks 2 --steps-per-task 4096

Prints, per point, the ETA shown, the time actually left and their ratio (1.00 = exact), plus the
run's wall time. ``--busy N`` starts N processes that spin a core each for the whole run (the
load a shared machine adds); other jobs already running count too, so say what ran beside it.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(__file__))
from threads_under_load import busy  # noqa: E402

QUICK_START = ["--suite", "cw10", "--tasks", "2", "--steps-per-task", "32768"]
ETA = re.compile(rb"run ETA (>=)?(\d+):(\d\d):(\d\d)")


def frames(cmd: list[str], env: dict[str, str]) -> tuple[list[tuple[float, bytes]], float, int]:
    """Every ``\\r``/``\\n``-separated piece of the command's stderr with the time it arrived."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, env=env)
    assert proc.stderr is not None
    out: list[tuple[float, bytes]] = []
    buf = b""
    while chunk := os.read(proc.stderr.fileno(), 4096):
        buf += chunk
        *done, buf = re.split(rb"[\r\n]", buf)
        now = time.perf_counter() - t0
        out.extend((now, f) for f in done if f)
    rc = proc.wait()
    return out, time.perf_counter() - t0, rc


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--busy", type=int, default=0, help="busy processes to start beside the run")
    p.add_argument("crl_args", nargs="*", help="arguments of python -m rl_moe.crl (default: the README's quick start)")
    args = p.parse_args()
    load_before = os.getloadavg()[0]
    with busy(args.busy), tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "rl_moe.crl", *(args.crl_args or QUICK_START), "--run-dir", str(Path(tmp) / "run")]
        got, total, rc = frames(cmd, {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")})
    if rc != 0:
        print(f"the run exited {rc}", file=sys.stderr)
        return 1
    etas = [(t, bool(m.group(1)), int(m.group(2)) * 3600 + int(m.group(3)) * 60 + int(m.group(4))) for t, f in got if (m := ETA.search(f))]
    print(f"command: python -m rl_moe.crl {' '.join(args.crl_args or QUICK_START)}; busy processes started: {args.busy}; load before: {load_before:.1f}")
    print(f"wall time {total:.0f} s ({total / 60:.1f} min); {len(etas)} ETA frames")
    print("| point of the run | ETA shown (s) | time left (s) | shown / left |")
    print("|---|---|---|---|")
    for frac in (0.25, 0.5, 0.75):
        at = frac * total
        shown = [e for e in etas if e[0] <= at]
        if not shown:
            print(f"| {frac:.0%} | none yet | {total - at:.0f} | - |")
            continue
        t, bound, eta = shown[-1]
        left = total - t
        print(f"| {frac:.0%} | {'>=' if bound else ''}{eta} | {left:.0f} | {eta / left:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

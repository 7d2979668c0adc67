"""Every filesystem path the CLIs take, pointed where no folder can be made (/proc and /sys refuse
new folders even to root): one line naming the path, exit code 2, nothing written."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SMOKE = ["--suite", "smoke", "--tasks", "1", "--steps-per-task", "100", "--preset", "tiny"]
COMMANDS = {
    "crl --run-dir": lambda p: ["rl_moe.crl", *SMOKE, "--run-dir", p],
    "crl --out": lambda p: ["rl_moe.crl", *SMOKE, "--out", f"{p}/runs"],
    "crl --resume": lambda p: ["rl_moe.crl", "--resume", p],
    "crl --reference": lambda p: ["rl_moe.crl", *SMOKE, "--reference", p, "--out", "{tmp}"],
    "report --out": lambda p: ["rl_moe.report", str(REPO / "results" / "cw10-paper"), "--out", f"{p}/report"],
    "sweep --out": lambda p: ["rl_moe.sweep", "--suite", "smoke", "--method", "topk", "--seed", "0", "--out", p, "--", "--preset", "tiny"],
    "positions RUN_DIR": lambda p: ["rl_moe.positions", p],
}


@pytest.mark.parametrize("where", ["/proc/rl_moe-forbidden", "/sys/rl_moe-forbidden"])
@pytest.mark.parametrize("command", list(COMMANDS))
def test_a_path_where_nothing_can_be_made_exits_2_with_one_line(command: str, where: str, tmp_path: Path) -> None:
    if not Path(where).parent.is_dir():
        pytest.skip(f"{Path(where).parent} is not mounted here")
    argv = [a.replace("{tmp}", str(tmp_path)) for a in COMMANDS[command](where)]
    run = subprocess.run([sys.executable, "-m", *argv], capture_output=True, text=True, timeout=120, env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"})
    err = run.stderr.strip().splitlines()
    assert run.returncode == 2, run.stderr
    assert len(err) == 1 and err[0].startswith("error: ") and "rl_moe-forbidden" in err[0], run.stderr
    assert not Path(where).exists()
    assert list(tmp_path.iterdir()) == []  # nothing half-written elsewhere either

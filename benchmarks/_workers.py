"""A benchmark's worker process on one checkout: the same script in ``--worker`` mode, importing
that checkout's ``rl_moe`` first, answering one JSON line per request (``task_speed.py``,
``acting_forward.py``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


class Worker:
    """``script --worker *args`` run in ``tree`` with that tree first on the path; its first JSON
    line says which ``rl_moe`` it imported (``package``)."""

    def __init__(self, tree: Path, script: str, args: list[str]) -> None:
        env = {**os.environ, "PYTHONPATH": str(tree), "OMP_NUM_THREADS": "1"}
        cmd = [sys.executable, str(HERE / script), "--worker", *args]
        self.proc = subprocess.Popen(cmd, env=env, cwd=tree, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.package = str(self._read()["ready"])

    def _read(self) -> dict:  # type: ignore[type-arg]
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith("{"):
                return json.loads(line)
        raise RuntimeError(f"worker exited with {self.proc.wait()}")

    def ask(self, what: str) -> dict:  # type: ignore[type-arg]
        assert self.proc.stdin is not None
        self.proc.stdin.write(what + "\n")
        self.proc.stdin.flush()
        return self._read()

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait()

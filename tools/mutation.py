"""Mutation testing of one module with mutmut (PyPI), in a scratch copy of this checkout.

    pip install mutmut
    python -m tools.mutation rl_moe/algos/trac.py tests/test_plasticity_methods.py tests/test_method_mutations.py -k trac

mutmut mutates the module (operators, constants, arguments), runs the given tests against each
mutant and counts the mutants no test fails on ("survived"). The scratch copy keeps mutmut's
``mutants/`` folder and its ``setup.cfg`` out of the checkout; the summary (killed, survived and
each survivor's diff) is printed, and with ``--json`` written to a file. docs/contributing.md
keeps the scores and why each survivor cannot matter.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("module", help="the file to mutate, e.g. rl_moe/algos/kl_lr.py")
    p.add_argument("tests", nargs="+", help="test files that should kill its mutants")
    p.add_argument("-k", dest="keyword", default=None, help="pytest -k expression to select the tests")
    p.add_argument("--json", type=Path, default=None, help="also write the summary here")
    opts = p.parse_args(argv)
    mutmut = shutil.which("mutmut")
    if mutmut is None:
        sys.exit("mutmut is not installed: pip install mutmut")
    with tempfile.TemporaryDirectory(prefix="rl_moe-mutation-") as tmp:
        work = Path(tmp) / "checkout"
        shutil.copytree(ROOT, work, ignore=shutil.ignore_patterns(".git", "runs", "mutants", "__pycache__", "*.egg-info"))
        selection = "\n    ".join(opts.tests)
        args = "-p no:xdist -x -q" + (f" -k {opts.keyword}" if opts.keyword else "")
        (work / "setup.cfg").write_text(
            f"[mutmut]\nsource_paths={opts.module}\nalso_copy=\n    rl_moe\n    envs\n"
            f"pytest_add_cli_args_test_selection={selection}\npytest_add_cli_args={args}\n"
        )
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        subprocess.run([mutmut, "run"], cwd=work, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
        listing = subprocess.run([mutmut, "results", "--all", "true"], cwd=work, env=env, capture_output=True, text=True, check=False).stdout
        status = dict(line.strip().rsplit(": ", 1) for line in listing.splitlines() if ": " in line)
        survivors = {}
        for name, state in status.items():
            if state == "survived":
                shown = subprocess.run([mutmut, "show", name], cwd=work, env=env, capture_output=True, text=True, check=False).stdout
                survivors[name] = [line for line in shown.splitlines() if line.startswith(("+ ", "- "))]
    counts = {state: sum(1 for s in status.values() if s == state) for state in sorted(set(status.values()))}
    summary = {"module": opts.module, "tests": opts.tests, "keyword": opts.keyword, "mutants": len(status), "counts": counts, "survivors": survivors}
    print(json.dumps(summary, indent=2))
    if opts.json:
        opts.json.write_text(json.dumps(summary, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

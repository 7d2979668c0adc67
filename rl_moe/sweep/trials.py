"""The trials of a sweep: the grid, each trial's command, folder and environment, and running one."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import product
from pathlib import Path

from rl_moe.envs.factories import resolve_vec_env_type
from rl_moe.envs.suites import load_suite
from rl_moe.errors import UsageError
from rl_moe.rundir import RunDir


class SweepError(ValueError):
    """A user mistake in the sweep arguments (one line, exit code 2)."""


@dataclass(frozen=True)
class Trial:
    """One grid point: the arguments of one ``rl_moe.crl`` run and its folder.

    :param suite: suite name or suite .json path
    :param method: method name (``rl_moe.continual.methods.METHODS``)
    :param algo: a key of :data:`~rl_moe.continual.learners.LEARNERS`
    :param protocol: ``crl`` or ``rl``
    :param seed: run seed
    :param run_dir: deterministic run folder (re-running resumes it)
    :param tasks: how many of the suite's tasks the trial trains (None: unknown, the suite does
        not load); a folder holding a finished run of fewer tasks is continued, not skipped
    :param args: ``rl_moe.crl`` arguments of this trial's method variant alone (:class:`MethodSpec`)
    :param heldout: score the finished run on this many held-out positions (0: not)
    :param experts: record the finished run's expert usage (``python -m rl_moe.experts``)
    """

    suite: str
    method: str
    algo: str
    protocol: str
    seed: int
    run_dir: Path
    tasks: int | None = None
    args: tuple[str, ...] = ()
    heldout: int = 0
    experts: bool = False

    @property
    def name(self) -> str:
        return f"{self.run_dir.parent.name}/{self.run_dir.name}"


#: A variant's label becomes part of a folder name: one plain word.
_LABEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]*")


@dataclass(frozen=True)
class MethodSpec:
    """One ``--method`` entry: a method name (``sphere``), or a named variant of one with
    ``rl_moe.crl`` arguments of its own, ``"LABEL=METHOD ARGS"``, e.g.
    ``"lossratio=sphere --set reg.sphere.coef_mode=loss_ratio --set reg.sphere.rho=0.05"``. A
    variant's trials go to folders named by its label (``ppo-lossratio-crl-s0``); its arguments
    come after the ones every trial gets, so they win. ``"sphere ARGS"`` without a label keeps
    the method's folder name (one entry per label: the report tells the settings apart).

    :param label: the name in folders (the method's own name when no label is given)
    :param method: the ``rl_moe.crl`` method
    :param args: the variant's own arguments
    """

    label: str
    method: str
    args: tuple[str, ...] = ()

    @classmethod
    def parse(cls, text: str) -> MethodSpec:
        """Read one ``--method`` entry.

        :raises SweepError: a label that is not one word, or a variant without a method
        """
        try:
            words = shlex.split(text)
        except ValueError as exc:
            raise SweepError(f"--method {text!r}: {exc}") from None
        if not words:
            raise SweepError("--method: an empty entry; give a method name or LABEL=METHOD ARGS")
        head, args = words[0], tuple(words[1:])
        label, _, method = head.partition("=") if "=" in head else (head, "", head)
        if not _LABEL.fullmatch(label) or not method:
            raise SweepError(f"--method {text!r}: expected METHOD or LABEL=METHOD [ARGS] with LABEL a plain word (letters, digits, _ . + -)")
        return cls(label, method, args)


@dataclass(frozen=True)
class SweepConfig:
    """What to run and where.

    :param suites: suite names or .json paths
    :param methods: method names or variants (:class:`MethodSpec`)
    :param algos: learners
    :param protocols: ``crl`` and/or ``rl``
    :param seeds: seeds
    :param out: runs root; trial folders are ``<out>/<suite>/<algo>-<method>-<protocol>-s<seed>``
    :param crl_args: extra ``rl_moe.crl`` arguments given to every trial (``--steps-per-task 1000``, ...)
    :param cpus_per_trial: CPUs reserved per trial (Ray, and the local backend's automatic
        ``parallel``); also the trial's thread count
    :param gpus_per_trial: GPUs reserved per trial (fractions share a GPU)
    :param parallel: trials the local backend runs side by side; None: as many as the CPUs and
        GPUs hold (:func:`local_slots`)
    :param heldout: score each finished trial on this many held-out positions
        (``python -m rl_moe.positions``; 0: not)
    :param experts: record each finished trial's expert usage (``python -m rl_moe.experts``)
    """

    suites: tuple[str, ...]
    methods: tuple[str, ...]
    algos: tuple[str, ...] = ("ppo",)
    protocols: tuple[str, ...] = ("crl",)
    seeds: tuple[int, ...] = (0,)
    out: Path = Path("runs")
    crl_args: tuple[str, ...] = ()
    cpus_per_trial: float = 1.0
    gpus_per_trial: float = 0.0
    parallel: int | None = None
    heldout: int = 0
    experts: bool = False

    @property
    def method_specs(self) -> tuple[MethodSpec, ...]:
        return tuple(MethodSpec.parse(m) for m in self.methods)


@dataclass(frozen=True)
class Outcome:
    """How a trial ended: ``status`` is ``done``, ``skipped`` (already complete), ``busy`` (its
    folder is locked by another live process, named in ``log``) or ``failed``;
    ``env_steps`` counts the steps it trained in this sweep (a resumed trial's earlier ones not)."""

    trial: Trial
    status: str
    returncode: int = 0
    seconds: float = 0.0
    log: str = ""
    env_steps: int = 0


#: Runs one trial command and returns its outcome (injectable: tests pass a fake one).
TrialRunner = Callable[[Trial, list[str], dict[str, str]], Outcome]


def suite_label(suite: str) -> str:
    """Folder name of a suite: the built-in name, or the stem of a suite .json path."""
    return Path(suite).stem if suite.endswith(".json") else suite


def flag_values(args: Sequence[str], flag: str) -> tuple[str, ...]:
    """The values of ``flag`` among a trial's extra ``rl_moe.crl`` arguments, in either spelling
    (``--set KEY=VALUE`` or ``--set=KEY=VALUE``), in command-line order, so the last one wins as
    in the CLI."""
    values = []
    for i, arg in enumerate(args):
        if arg == flag and i + 1 < len(args):
            values.append(args[i + 1])
        elif arg.startswith(f"{flag}="):
            values.append(arg.split("=", 1)[1])
    return tuple(values)


def trial_rules_tag(suite: str, algo: str, method: str, crl_args: Sequence[str]) -> str:
    """The run-folder tag of the rules a trial's ``--set`` moves from its suite's
    (:func:`~rl_moe.continual.resolve.rules_tag`); ``""`` when it does not resolve, for
    :func:`validate` reports that trial's error itself."""
    from rl_moe.continual.resolve import RunRequest, resolve, rules_tag  # the CLI's resolver: torch

    try:
        presets = flag_values(crl_args, "--preset")
        request = RunRequest(suite=suite, algo=algo, method=method, vec_env="dummy", preset=presets[-1] if presets else None, overrides=flag_values(crl_args, "--set"))
        return rules_tag(resolve(request))
    except UsageError:
        return ""


def grid(cfg: SweepConfig) -> list[Trial]:
    """Every grid point, seed by seed: all of seed 0's trials (suite, algo, method, protocol) before
    any of seed 1's, so that a sweep stopped at any point has given its methods equal seed counts
    (within one). A trial whose ``--set`` changes its suite's rules (clipping, evaluation
    positions) names them in its folder."""
    specs = cfg.method_specs
    tags = {(s, a, m): trial_rules_tag(s, a, m.method, (*cfg.crl_args, *m.args)) for s, a, m in product(cfg.suites, cfg.algos, specs)}
    counts = {s: trial_tasks(s, cfg.crl_args) for s in cfg.suites}
    return [
        Trial(s, m.method, a, p, seed, cfg.out / suite_label(s) / f"{a}-{m.label}-{p}{tags[s, a, m]}-s{seed}", counts[s], m.args, cfg.heldout, cfg.experts)
        for seed, s, a, m, p in product(cfg.seeds, cfg.suites, cfg.algos, specs, cfg.protocols)
    ]


def trial_tasks(suite: str, crl_args: Sequence[str]) -> int | None:
    """Tasks a trial of ``suite`` trains: the last ``--tasks`` among its arguments, else all of the
    suite's; None when neither reads (the trial reports the error itself)."""
    asked = flag_values(crl_args, "--tasks")
    try:
        return int(asked[-1]) if asked else len(load_suite(suite).tasks)
    except (ValueError, UsageError):
        return None


def stored_tasks(run_dir: Path) -> int | None:
    """How many tasks the run in ``run_dir`` was started with (None: no readable results.json)."""
    try:
        return len(json.loads(RunDir(run_dir).results.read_text())["tasks"])
    except (OSError, json.JSONDecodeError, KeyError, TypeError):
        return None


def suite_family(suite: str) -> str | None:
    """The env family of a suite name or file; None if it does not load (the trial then reports
    the suite's own error)."""
    try:
        return load_suite(suite).family
    except UsageError:
        return None


def trial_command(trial: Trial, cfg: SweepConfig) -> list[str]:
    """The ``python -m rl_moe.crl`` command line of a trial.

    Unless the extra arguments name them, the trial's ``--vec-env`` and ``--threads`` are chosen
    for the CPUs it reserves, not for the whole machine: eight trials side by side must not each
    start a worker process per env or a thread per core.
    """
    # A folder holding a shorter run is continued through the suite's next tasks (rl_moe.crl
    # extends a run only when --tasks asks for more than it stored).
    stored = stored_tasks(trial.run_dir)
    grow = ["--tasks", str(trial.tasks)] if trial.tasks is not None and stored is not None and stored < trial.tasks and not flag_values(cfg.crl_args, "--tasks") else []
    vec_env = [] if "--vec-env" in (*cfg.crl_args, *trial.args) else ["--vec-env", resolve_vec_env_type("auto", 2, int(cfg.cpus_per_trial), suite_family(trial.suite))]
    threads = [] if "--threads" in (*cfg.crl_args, *trial.args) else ["--threads", str(max(1, int(cfg.cpus_per_trial)))]
    return [
        sys.executable, "-m", "rl_moe.crl",
        "--suite", trial.suite, "--method", trial.method, "--algo", trial.algo,
        "--protocol", trial.protocol, "--seed", str(trial.seed),
        "--run-dir", str(trial.run_dir), "--no-progress", *vec_env, *threads, *grow, *cfg.crl_args, *trial.args,
    ]  # fmt: skip


def trial_env(cfg: SweepConfig) -> dict[str, str]:
    """Environment of a trial: one BLAS/torch thread per reserved CPU, so trials do not oversubscribe,
    and this checkout on ``PYTHONPATH`` so Ray workers started elsewhere import the same ``rl_moe``."""
    threads = str(max(1, int(cfg.cpus_per_trial)))
    root = str(Path(__file__).resolve().parents[2])
    path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads, "PYTHONPATH": path}


def fresh(run_dir: Path, name: str) -> bool:
    """``run_dir/name`` exists and is not older than the run's ``results.json`` (a run continued
    after it was scored is scored again)."""
    rundir = RunDir(run_dir)
    try:
        return (rundir.path / name).stat().st_mtime >= rundir.results.stat().st_mtime
    except OSError:
        return False


def post_steps(trial: Trial) -> list[tuple[list[str], str]]:
    """What runs after the trial's run is complete, as (command, the file it writes): the held-out
    scores (``--heldout``) and the expert usage (``--experts``), each with one torch thread."""
    steps = []
    if trial.heldout:
        steps.append(([sys.executable, "-m", "rl_moe.positions", str(trial.run_dir), "--heldout", str(trial.heldout), "--threads", "1"], f"positions-{trial.heldout}.json"))
    if trial.experts:
        steps.append(([sys.executable, "-m", "rl_moe.experts", str(trial.run_dir), "--threads", "1"], "experts.json"))
    return steps


def is_finished(trial: Trial) -> bool:
    """Nothing left to do for the trial: its run is complete and every post step's file is fresh."""
    return is_complete(trial.run_dir, trial.tasks) and all(fresh(trial.run_dir, name) for _, name in post_steps(trial))


def is_complete(run_dir: Path, tasks: int | None = None) -> bool:
    """The trial's ``results.json`` exists, says ``"complete": true`` and, if ``tasks`` is given,
    holds at least that many tasks (a finished three-task slice is not a finished CW10 run)."""
    try:
        data = json.loads(RunDir(run_dir).results.read_text())
        return bool(data.get("complete")) and (tasks is None or len(data["tasks"]) >= tasks)
    except (OSError, json.JSONDecodeError, AttributeError, KeyError, TypeError):
        return False


def trained_steps(run_dir: Path) -> int:
    """Env steps a resume of the run keeps: its finished tasks' (``task_segments``) and the
    unfinished task's up to its in-task checkpoint (``in_task``); 0 without a readable results.json."""
    try:
        data = json.loads(RunDir(run_dir).results.read_text())
        segments = data.get("task_segments", [])
        in_task = data.get("in_task") or {}
        partial = int(in_task["step"]) - int(in_task["task_start"]) if in_task else 0
        return int(sum(end - start for start, end in segments)) + partial
    except (OSError, json.JSONDecodeError, AttributeError, TypeError, ValueError, KeyError):
        return 0


def run_subprocess(trial: Trial, command: list[str], env: dict[str, str]) -> Outcome:
    """Run the trial's CLI command, then, once its run is complete, its post steps
    (:func:`post_steps`) whose files are not fresh, appending their output to ``<run_dir>/sweep.log``."""
    trial.run_dir.mkdir(parents=True, exist_ok=True)
    log = RunDir(trial.run_dir).sweep_log
    start = time.monotonic()
    with log.open("a") as fh:
        rc = 0
        for cmd, name in [(command, ""), *post_steps(trial)]:
            if name and (rc != 0 or not is_complete(trial.run_dir, trial.tasks) or fresh(trial.run_dir, name)):
                continue
            fh.write(f"$ {' '.join(cmd)}\n")
            fh.flush()
            rc = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env, check=False).returncode
    ok = rc == 0 and is_finished(trial)
    return Outcome(trial, "done" if ok else "failed", rc, time.monotonic() - start, str(log))

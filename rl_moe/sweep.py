"""``python -m rl_moe.sweep``: a grid of suites × methods × algos × protocols × seeds.

Each grid point is one ``python -m rl_moe.crl`` run in a deterministic folder
``<out>/<suite>/<algo>-<method>-<protocol>-s<seed>``, so re-running the same sweep skips finished
trials (``results.json`` with ``"complete": true``) and resumes unfinished ones. Trials run on Ray
(a local cluster by default, ``--address`` to join one) or, without Ray, one after another.

Example (the paper's CW10 comparison, 5 seeds)::

    python -m rl_moe.sweep --suite cw10 --method topk sphere --protocol crl rl --seed 0 1 2 3 4

Several seeds side by side on one GPU machine (8 trials sharing the GPU, 2 CPUs each)::

    python -m rl_moe.sweep --suite cw10 --method sphere --seed 0 1 2 3 4 5 6 7 \
        --device cuda --cpus-per-trial 2 --gpus-per-trial 0.125

The sweep prints, and writes to ``<out>/sweep.json``, the env steps its trials trained together
per second of wall time.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field, replace
from itertools import product
from pathlib import Path

from rl_moe.cli import EXIT_USAGE, UsageParser
from rl_moe.continual.envs import resolve_vec_env_type
from rl_moe.continual.learners import LEARNERS
from rl_moe.rundir import RunDir

EXIT_FAILED = 1
EXIT_INTERRUPTED = 130
BACKENDS = ("auto", "ray", "sequential")


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
    """

    suite: str
    method: str
    algo: str
    protocol: str
    seed: int
    run_dir: Path

    @property
    def name(self) -> str:
        return f"{self.run_dir.parent.name}/{self.run_dir.name}"


@dataclass(frozen=True)
class SweepConfig:
    """What to run and where.

    :param suites: suite names or .json paths
    :param methods: method names
    :param algos: learners
    :param protocols: ``crl`` and/or ``rl``
    :param seeds: seeds
    :param out: runs root; trial folders are ``<out>/<suite>/<algo>-<method>-<protocol>-s<seed>``
    :param crl_args: extra ``rl_moe.crl`` arguments given to every trial (``--steps-per-task 1000``, ...)
    :param cpus_per_trial: Ray CPUs reserved per trial; also the trial's thread count
    :param gpus_per_trial: Ray GPUs reserved per trial (fractions share a GPU)
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


@dataclass(frozen=True)
class Outcome:
    """How a trial ended: ``status`` is ``done``, ``skipped`` (already complete) or ``failed``;
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


def grid(cfg: SweepConfig) -> list[Trial]:
    """Every grid point in a fixed order (suite, algo, method, protocol, seed)."""
    return [
        Trial(s, m, a, p, seed, cfg.out / suite_label(s) / f"{a}-{m}-{p}-s{seed}")
        for s, a, m, p, seed in product(cfg.suites, cfg.algos, cfg.methods, cfg.protocols, cfg.seeds)
    ]


def trial_command(trial: Trial, cfg: SweepConfig) -> list[str]:
    """The ``python -m rl_moe.crl`` command line of a trial.

    Unless the extra arguments name one, the trial's ``--vec-env`` is chosen for the CPUs it
    reserves, not for the whole machine: eight trials side by side must not each start a worker
    process per env.
    """
    vec_env = [] if "--vec-env" in cfg.crl_args else ["--vec-env", resolve_vec_env_type("auto", 2, int(cfg.cpus_per_trial))]
    return [
        sys.executable, "-m", "rl_moe.crl",
        "--suite", trial.suite, "--method", trial.method, "--algo", trial.algo,
        "--protocol", trial.protocol, "--seed", str(trial.seed),
        "--run-dir", str(trial.run_dir), "--no-progress", *vec_env, *cfg.crl_args,
    ]  # fmt: skip


def trial_env(cfg: SweepConfig) -> dict[str, str]:
    """Environment of a trial: one BLAS/torch thread per reserved CPU, so trials do not oversubscribe,
    and this checkout on ``PYTHONPATH`` so Ray workers started elsewhere import the same ``rl_moe``."""
    threads = str(max(1, int(cfg.cpus_per_trial)))
    root = str(Path(__file__).resolve().parents[1])
    path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads, "PYTHONPATH": path}


def is_complete(run_dir: Path) -> bool:
    """The trial's ``results.json`` exists and says ``"complete": true``."""
    try:
        return bool(json.loads(RunDir(run_dir).results.read_text()).get("complete"))
    except (OSError, json.JSONDecodeError, AttributeError):
        return False


def trained_steps(run_dir: Path) -> int:
    """Env steps of the run's finished tasks (its ``task_segments``); 0 without a readable results.json."""
    try:
        segments = json.loads(RunDir(run_dir).results.read_text()).get("task_segments", [])
        return int(sum(end - start for start, end in segments))
    except (OSError, json.JSONDecodeError, AttributeError, TypeError, ValueError):
        return 0


def run_subprocess(trial: Trial, command: list[str], env: dict[str, str]) -> Outcome:
    """Run the trial's CLI command, appending its output to ``<run_dir>/sweep.log``."""
    trial.run_dir.mkdir(parents=True, exist_ok=True)
    log = RunDir(trial.run_dir).sweep_log
    start = time.monotonic()
    with log.open("a") as fh:
        fh.write(f"$ {' '.join(command)}\n")
        fh.flush()
        rc = subprocess.run(command, stdout=fh, stderr=subprocess.STDOUT, env=env, check=False).returncode
    ok = rc == 0 and is_complete(trial.run_dir)
    return Outcome(trial, "done" if ok else "failed", rc, time.monotonic() - start, str(log))


def validate(cfg: SweepConfig, trials: Sequence[Trial]) -> None:
    """Check every trial with the CLI's own parser and resolver, so nothing starts on a bad grid.

    :raises SweepError: the first bad trial, with the CLI's message (which names the valid choices)
    """
    if cfg.cpus_per_trial <= 0:
        raise SweepError(f"--cpus-per-trial must be > 0, got {cfg.cpus_per_trial}")
    if cfg.gpus_per_trial < 0:
        raise SweepError(f"--gpus-per-trial must be >= 0, got {cfg.gpus_per_trial}")
    if len(set(cfg.seeds)) != len(cfg.seeds):
        raise SweepError(f"duplicate seeds in --seed {' '.join(map(str, cfg.seeds))}")
    from rl_moe import crl
    from rl_moe.continual.errors import UsageError

    parser = crl.build_parser()
    for trial in trials:
        argv = trial_command(trial, cfg)[3:]
        try:
            crl.prepare(parser.parse_args(argv))
        except UsageError as exc:
            raise SweepError(f"trial {trial.name}: {exc}") from None
        except SystemExit:  # the CLI parser already printed its one-line error
            raise SweepError(f"trial {trial.name}: bad arguments {' '.join(argv)}") from None


def _report(outcome: Outcome, done: int, total: int) -> None:
    extra = {"done": f"{outcome.seconds:.0f}s", "skipped": "already complete", "failed": f"exit {outcome.returncode}, log {outcome.log}"}
    print(f"[{done}/{total}] {outcome.status:<7} {outcome.trial.name} ({extra[outcome.status]})", flush=True)


def run_sequential(jobs: Sequence[tuple[Trial, list[str]]], env: dict[str, str], runner: TrialRunner) -> Iterable[Outcome]:
    """Run trials one after another in this process."""
    for trial, command in jobs:
        yield runner(trial, command, env)


@dataclass(frozen=True)
class RayOptions:
    """How to reach Ray: ``address`` None starts a local cluster of ``num_cpus`` CPUs."""

    address: str | None = None
    num_cpus: int | None = None
    num_gpus: int | None = None
    init_kwargs: dict = field(default_factory=dict)


def run_ray(
    jobs: Sequence[tuple[Trial, list[str]]], env: dict[str, str], runner: TrialRunner, cfg: SweepConfig, opts: RayOptions
) -> Iterable[Outcome]:
    """Run trials as Ray tasks, each reserving ``cpus_per_trial``/``gpus_per_trial``; yields as they finish."""
    import ray

    started_here = not ray.is_initialized()
    if started_here:
        if opts.address is not None:
            ray.init(address=opts.address, **opts.init_kwargs)
        else:
            ray.init(num_cpus=opts.num_cpus, num_gpus=opts.num_gpus, include_dashboard=False, **opts.init_kwargs)
    remote = ray.remote(num_cpus=cfg.cpus_per_trial, num_gpus=cfg.gpus_per_trial, max_retries=0)(runner)
    pending = [remote.remote(trial, command, env) for trial, command in jobs]
    try:
        while pending:
            ready, pending = ray.wait(pending, num_returns=1)
            yield ray.get(ready[0])
    finally:
        for ref in pending:
            ray.cancel(ref, force=True)
        if started_here:
            ray.shutdown()


def ray_available() -> bool:
    """Ray is installed (the ``sweep`` extra)."""
    try:
        import ray  # noqa: F401
    except ImportError:
        return False
    return True


def run_sweep(
    cfg: SweepConfig,
    backend: str = "auto",
    runner: TrialRunner = run_subprocess,
    ray_opts: RayOptions = RayOptions(),
) -> list[Outcome]:
    """Run (or skip) every trial of the grid and write ``<out>/sweep.json``.

    :param cfg: the grid
    :param backend: ``auto`` (Ray when installed), ``ray`` or ``sequential``
    :param runner: runs one trial; the default runs the CLI in a subprocess
    :param ray_opts: cluster options for the Ray backend
    """
    if backend not in BACKENDS:
        raise SweepError(f"unknown backend {backend!r}; valid choices: {', '.join(BACKENDS)}")
    trials = grid(cfg)
    if backend == "auto":
        backend = "ray" if ray_available() else "sequential"
        if backend == "sequential":
            print("ray is not installed (pip install 'rl_moe[sweep]'): running trials sequentially", flush=True)
    elif backend == "ray" and not ray_available():
        raise SweepError("backend 'ray' needs ray (pip install 'rl_moe[sweep]'); valid choices without it: sequential")
    outcomes = [Outcome(t, "skipped") for t in trials if is_complete(t.run_dir)]
    for i, o in enumerate(outcomes, 1):
        _report(o, i, len(trials))
    jobs = [(t, trial_command(t, cfg)) for t in trials if not is_complete(t.run_dir)]
    before = {t.run_dir: trained_steps(t.run_dir) for t, _ in jobs}
    env = trial_env(cfg)
    start = time.monotonic()
    stream = run_ray(jobs, env, runner, cfg, ray_opts) if backend == "ray" and jobs else run_sequential(jobs, env, runner)
    for outcome in stream:
        outcome = replace(outcome, env_steps=max(0, trained_steps(outcome.trial.run_dir) - before[outcome.trial.run_dir]))
        outcomes.append(outcome)
        _report(outcome, len(outcomes), len(trials))
    throughput = Throughput(sum(o.env_steps for o in outcomes), time.monotonic() - start)
    if jobs:
        print(f"sweep: {throughput.env_steps} env steps in {throughput.seconds:.0f}s: {throughput.per_second:.0f} env steps/s aggregate", flush=True)
    write_manifest(cfg, outcomes, throughput)
    return outcomes


@dataclass(frozen=True)
class Throughput:
    """Env steps trained by the trials run in a sweep and the wall time they took together
    (trials side by side on one machine add up: the figure for a multi-seed GPU sweep)."""

    env_steps: int
    seconds: float

    @property
    def per_second(self) -> float:
        return self.env_steps / self.seconds if self.seconds > 0 else 0.0


def write_manifest(cfg: SweepConfig, outcomes: Sequence[Outcome], throughput: Throughput | None = None) -> Path:
    """``<out>/sweep.json``: the grid, how each trial ended and the aggregate env steps/s (for the
    record; the report does not need it)."""
    cfg.out.mkdir(parents=True, exist_ok=True)
    path = cfg.out / "sweep.json"
    cfg_dict = {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(cfg).items()}
    rows = [
        {
            "run_dir": str(o.trial.run_dir), "status": o.status, "returncode": o.returncode,
            "seconds": round(o.seconds, 1), "env_steps": o.env_steps,
        }  # fmt: skip
        for o in sorted(outcomes, key=lambda o: str(o.trial.run_dir))
    ]
    data: dict = {"config": cfg_dict, "trials": rows}
    if throughput is not None:
        data["throughput"] = {**asdict(throughput), "env_steps_per_s": round(throughput.per_second, 1)}
    path.write_text(json.dumps(data, indent=2))
    return path


def build_parser() -> argparse.ArgumentParser:
    """Sweep arguments; everything after ``--`` goes to every ``rl_moe.crl`` run unchanged."""
    p = UsageParser(
        prog="python -m rl_moe.sweep",
        description="Run a grid of rl_moe.crl trials (suites x methods x algos x protocols x seeds). "
        "Arguments after -- are passed to every trial.",
    )
    p.add_argument("--suite", nargs="+", required=True, help="suites (built-in names or .json paths)")
    p.add_argument("--method", nargs="+", required=True, help="methods (see python -m rl_moe.crl --list)")
    p.add_argument("--algo", nargs="+", default=["ppo"], help=f"learners: {' '.join(LEARNERS)} (default ppo)")
    p.add_argument("--protocol", nargs="+", default=["crl"], help="crl and/or rl (default crl)")
    p.add_argument("--seed", nargs="+", type=int, default=[0], help="seeds (default 0)")
    p.add_argument("--steps-per-task", type=int, default=None, help="passed to every trial")
    p.add_argument("--tasks", type=int, default=None, help="passed to every trial: train the first N tasks")
    p.add_argument("--device", default=None, help="passed to every trial: auto, cpu or cuda")
    p.add_argument("--out", type=Path, default=Path("runs"), help="runs root (default runs)")
    p.add_argument("--backend", default="auto", help=f"{', '.join(BACKENDS)} (auto: ray when installed)")
    p.add_argument("--address", default=None, help="join this Ray cluster (e.g. auto or ray://host:10001)")
    p.add_argument("--num-cpus", type=int, default=None, help="CPUs of the local Ray cluster (default: all)")
    p.add_argument("--cpus-per-trial", type=float, default=1.0, help="Ray CPUs (and threads) per trial")
    p.add_argument("--gpus-per-trial", type=float, default=0.0, help="Ray GPUs per trial (0.5 = two per GPU)")
    p.add_argument("--dry-run", action="store_true", help="validate and print the trial commands, run nothing")
    return p


def parse(argv: Sequence[str]) -> tuple[argparse.Namespace, SweepConfig]:
    """Split ``argv`` at ``--`` and build the :class:`SweepConfig`."""
    argv = list(argv)
    extra: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, extra = argv[:cut], argv[cut + 1 :]
    args = build_parser().parse_args(argv)
    passthrough = [
        *(["--steps-per-task", str(args.steps_per_task)] if args.steps_per_task is not None else []),
        *(["--tasks", str(args.tasks)] if args.tasks is not None else []),
        *(["--device", args.device] if args.device is not None else []),
        *extra,
    ]
    # absolute paths: Ray workers may not share this process's working directory
    suites = tuple(str(Path(s).resolve()) if s.endswith(".json") else s for s in args.suite)
    cfg = SweepConfig(
        suites=suites, methods=tuple(args.method), algos=tuple(args.algo), protocols=tuple(args.protocol),
        seeds=tuple(args.seed), out=args.out.resolve(), crl_args=tuple(passthrough),
        cpus_per_trial=args.cpus_per_trial, gpus_per_trial=args.gpus_per_trial,
    )  # fmt: skip
    return args, cfg


def main(argv: Sequence[str] | None = None, runner: TrialRunner = run_subprocess) -> int:
    """Entry point: 0 when every trial finished, 1 when some failed, 2 on a bad grid."""
    try:
        args, cfg = parse(sys.argv[1:] if argv is None else argv)
    except SystemExit as exc:  # argparse already printed its one-line error (or --help)
        return int(exc.code or 0)
    try:
        if args.backend not in BACKENDS:
            raise SweepError(f"unknown backend {args.backend!r}; valid choices: {', '.join(BACKENDS)}")
        if args.address is not None and (args.backend == "sequential" or not ray_available()):
            raise SweepError(f"--address {args.address!r} needs the ray backend (pip install 'rl_moe[sweep]')")
        trials = grid(cfg)
        validate(cfg, trials)
        if args.dry_run:
            for t in trials:
                state = "complete, skipped" if is_complete(t.run_dir) else "to run"
                print(f"# {t.name}: {state}\n{' '.join(trial_command(t, cfg))}")
            return 0
        ray_opts = RayOptions(address=args.address, num_cpus=args.num_cpus)
        outcomes = run_sweep(cfg, args.backend, runner, ray_opts)
    except SweepError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return EXIT_USAGE
    except KeyboardInterrupt:
        sys.stderr.write("\ninterrupted; re-run the same command to resume unfinished trials\n")
        return EXIT_INTERRUPTED
    failed = [o for o in outcomes if o.status == "failed"]
    print(f"sweep: {len(outcomes) - len(failed)}/{len(outcomes)} trials complete; runs in {cfg.out}")
    return EXIT_FAILED if failed else 0


if __name__ == "__main__":
    sys.exit(main())

"""The sweep's program: validate the grid, pick a backend, run the trials, report and write the
manifest (``python -m rl_moe.sweep``; the package docstring describes it)."""


from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from contextlib import closing
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from rl_moe import crl
from rl_moe.cli import EXIT_INTERRUPTED, EXIT_USAGE, UsageParser, interrupts_as_keyboard
from rl_moe.continual.learners import LEARNERS
from rl_moe.errors import UsageError
from rl_moe.rundir import check_writable_folder
from rl_moe.runlock import Holder, lock_holder
from rl_moe.sweep.backends import (
    LocalPlan, Outcomes, RayOptions, check_parallel, local_slots, pin_gpu, plan_local, ray_available, run_local,
    run_ray, run_sequential, visible_gpus,
)  # fmt: skip
from rl_moe.sweep.progress import Heartbeat, TrialStates
from rl_moe.sweep.trials import (
    MethodSpec, Outcome, SweepConfig, SweepError, Trial, TrialRunner, grid, is_complete, is_finished, post_steps, run_subprocess,
    suite_label, trained_steps, trial_command, trial_env,
)  # fmt: skip



EXIT_FAILED = 1
BACKENDS = ("auto", "ray", "local", "sequential")


def validate(cfg: SweepConfig, trials: Sequence[Trial]) -> None:
    """Check every trial with the CLI's own parser and resolver, so nothing starts on a bad grid.

    :raises SweepError: the first bad trial, with the CLI's message (which names the valid choices)
    """
    if cfg.cpus_per_trial <= 0:
        raise SweepError(f"--cpus-per-trial must be > 0, got {cfg.cpus_per_trial}")
    if cfg.gpus_per_trial < 0:
        raise SweepError(f"--gpus-per-trial must be >= 0, got {cfg.gpus_per_trial}")
    check_parallel(cfg)
    try:
        check_writable_folder(cfg.out, "--out")
    except ValueError as exc:
        raise SweepError(str(exc)) from None
    if len(set(cfg.seeds)) != len(cfg.seeds):
        raise SweepError(f"duplicate seeds in --seed {' '.join(map(str, cfg.seeds))}")
    if cfg.heldout < 0:
        raise SweepError(f"--heldout must be >= 0 (0: no held-out scoring), got {cfg.heldout}")
    labels = [m.label for m in cfg.method_specs]
    twice = sorted({label for label in labels if labels.count(label) > 1})
    if twice:
        raise SweepError(f"--method names {', '.join(twice)} more than once; give each variant a label of its own (LABEL=METHOD ARGS)")

    parser = crl.build_parser()
    for trial in trials:
        if is_finished(trial):  # skipped anyway; its checkpoints may be gone (a kept summary needs none)
            continue
        argv = trial_command(trial, cfg)[3:]
        try:
            crl.prepare(parser.parse_args(argv))
        except UsageError as exc:
            raise SweepError(f"trial {trial.name}: {exc}") from None
        except SystemExit:  # the CLI parser already printed its one-line error
            raise SweepError(f"trial {trial.name}: bad arguments {' '.join(argv)}") from None


def _holder_text(holder: Holder) -> str:
    return f"in use by process {holder.pid}" if holder.pid is not None else "in use by another process"


def recheck_at_launch(runner: TrialRunner) -> TrialRunner:
    """``runner`` that looks at its trial's folder again as the trial launches and as it returns.

    The grid is read once, when the sweep starts; a second sweep over the same grid (one started
    later, or on another machine sharing the folder) may have taken a trial since, or finished it.
    Such a trial is ``busy`` or ``skipped``, not run twice and not ``failed``: a launch that lost
    the race for the folder's lock (the CLI takes it only after its imports) exits with the CLI's
    "in use" error while the other process still holds the lock, and that is ``busy`` too.
    """

    def run(trial: Trial, command: list[str], env: dict[str, str]) -> Outcome:
        if is_finished(trial):
            return Outcome(trial, "skipped")
        if (holder := lock_holder(trial.run_dir)) is not None:
            return Outcome(trial, "busy", log=_holder_text(holder))
        outcome = runner(trial, command, env)
        if outcome.status == "failed" and outcome.returncode == EXIT_USAGE and (holder := lock_holder(trial.run_dir)) is not None:
            return replace(outcome, status="busy", log=_holder_text(holder))
        return outcome

    return run


def _report(outcome: Outcome, done: int, total: int) -> None:
    extra = {
        "done": f"{outcome.seconds:.0f}s",
        "skipped": "already complete",
        "busy": f"{outcome.log}; skipped",
        "failed": f"exit {outcome.returncode}, log {outcome.log}",
    }
    print(f"[{done}/{total}] {outcome.status:<7} {outcome.trial.name} ({extra[outcome.status]})", flush=True)


def resolve_backend(backend: str, cfg: SweepConfig, address: str | None = None) -> str:
    """The backend that runs the sweep: ``auto`` is Ray when installed (unless ``--parallel`` asks
    for the local backend), else ``local``.

    :raises SweepError: an unknown backend, Ray missing, or an option another backend needs
    """
    if backend not in BACKENDS:
        raise SweepError(f"unknown backend {backend!r}; valid choices: {', '.join(BACKENDS)}")
    has_ray = ray_available()
    if backend == "auto":
        backend = "ray" if has_ray and (cfg.parallel is None or address is not None) else "local"
    if backend == "ray" and not has_ray:
        raise SweepError("backend 'ray' needs ray (pip install 'rl_moe[sweep]'); valid choices without it: local, sequential")
    if address is not None and backend != "ray":
        raise SweepError(f"--address {address!r} needs the ray backend (pip install 'rl_moe[sweep]'); valid choices with it: auto, ray")
    if cfg.parallel is not None and backend != "local":
        raise SweepError(f"--parallel {cfg.parallel} needs the local backend, not {backend!r}; valid choices with it: auto, local")
    return backend


def _stream(
    backend: str, jobs: Sequence[tuple[Trial, list[str]]], env: dict[str, str], runner: TrialRunner,
    cfg: SweepConfig, ray_opts: RayOptions, plan: LocalPlan | None,
) -> Outcomes:  # fmt: skip
    if not jobs or backend == "sequential":  # nothing to run: no cluster, no pool
        return run_sequential(jobs, env, runner)
    if backend == "ray":
        return run_ray(jobs, env, runner, cfg, ray_opts)
    assert plan is not None
    return run_local(jobs, env, runner, plan)


def run_sweep(
    cfg: SweepConfig,
    backend: str = "auto",
    runner: TrialRunner = run_subprocess,
    ray_opts: RayOptions = RayOptions(),
    progress_every: float = 0.0,
) -> list[Outcome]:
    """Run (or skip) every trial of the grid and write ``<out>/sweep.json``.

    :param cfg: the grid
    :param backend: ``auto`` (Ray when installed, else local), ``ray``, ``local`` or ``sequential``
    :param runner: runs one trial; the default runs the CLI in a subprocess
    :param ray_opts: cluster options for the Ray backend; its ``num_cpus`` also sizes the local backend
    :param progress_every: seconds between progress lines (:mod:`rl_moe.sweep.progress`); 0 = none
    """
    chosen = resolve_backend(backend, cfg, ray_opts.address)
    trials = grid(cfg)
    complete = {t.run_dir for t in trials if is_finished(t)}
    # A trial whose folder another process is writing (an earlier sweep still running) is left to it.
    busy = {t.run_dir: h for t in trials if t.run_dir not in complete and (h := lock_holder(t.run_dir)) is not None}
    jobs = [(t, trial_command(t, cfg)) for t in trials if t.run_dir not in complete and t.run_dir not in busy]
    plan = plan_local(cfg, ray_opts.num_cpus, len(jobs)) if chosen == "local" else None
    if plan is not None:
        why = "ray is not installed (pip install 'rl_moe[sweep]'): " if backend == "auto" and not ray_available() else ""
        print(f"{why}running {plan.slots} trial{'s' * (plan.slots != 1)} at a time on this machine", flush=True)
    outcomes = [Outcome(t, "skipped") for t in trials if t.run_dir in complete]
    outcomes += [Outcome(t, "busy", log=_holder_text(busy[t.run_dir])) for t in trials if t.run_dir in busy]
    for i, o in enumerate(outcomes, 1):
        _report(o, i, len(trials))
    before = {t.run_dir: trained_steps(t.run_dir) for t, _ in jobs}
    start = time.monotonic()
    states = TrialStates()
    checked = recheck_at_launch(runner)
    tracked = checked if chosen == "ray" else states.wrap(checked)  # a Ray worker's records stay there
    with Heartbeat([t for t, _ in jobs], states, progress_every), closing(_stream(chosen, jobs, trial_env(cfg), tracked, cfg, ray_opts, plan)) as stream:
        for outcome in stream:
            states.mark_finished(outcome.trial.run_dir)
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
    p.add_argument(
        "--method", nargs="+", required=True,
        help="methods (see python -m rl_moe.crl --list), or variants with arguments of their own as one quoted word "
        "'LABEL=METHOD ARGS' (e.g. 'lossratio=sphere --set reg.sphere.coef_mode=loss_ratio'), whose folders take LABEL",
    )  # fmt: skip
    p.add_argument("--algo", nargs="+", default=["ppo"], help=f"learners: {' '.join(LEARNERS)} (default ppo)")
    p.add_argument("--protocol", nargs="+", default=["crl"], help="crl and/or rl (default crl)")
    p.add_argument("--seed", nargs="+", type=int, default=[0], help="seeds (default 0)")
    p.add_argument("--steps-per-task", type=int, default=None, help="passed to every trial")
    p.add_argument("--tasks", type=int, default=None, help="passed to every trial: train the first N tasks")
    p.add_argument("--device", default=None, help="passed to every trial: auto, cpu or cuda")
    p.add_argument("--out", type=Path, default=Path("runs"), help="runs root (default runs)")
    p.add_argument("--backend", default="auto", help=f"{', '.join(BACKENDS)} (auto: ray when installed, else local)")
    p.add_argument("--address", default=None, help="join this Ray cluster (e.g. auto or ray://host:10001)")
    p.add_argument("--num-cpus", type=int, default=None, help="CPUs the sweep may use on this machine (default: all)")
    p.add_argument("--parallel", type=int, default=None, help="local backend: trials side by side (default: as many as the CPUs and GPUs hold)")
    p.add_argument("--cpus-per-trial", type=float, default=1.0, help="CPUs (and threads) per trial")
    p.add_argument("--gpus-per-trial", type=float, default=0.0, help="GPUs per trial (0.5 = two per GPU)")
    p.add_argument("--heldout", type=int, default=0, help="score each finished trial on N held-out positions (python -m rl_moe.positions; default 0: not)")
    p.add_argument("--experts", action="store_true", help="record each finished trial's expert usage (python -m rl_moe.experts)")
    p.add_argument("--dry-run", action="store_true", help="validate and print the trial commands, run nothing")
    p.add_argument("--progress-every", type=float, default=60.0, help="seconds between progress lines (0: none; default 60)")
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
        cpus_per_trial=args.cpus_per_trial, gpus_per_trial=args.gpus_per_trial, parallel=args.parallel, heldout=args.heldout, experts=args.experts,
    )  # fmt: skip
    return args, cfg


def main(argv: Sequence[str] | None = None, runner: TrialRunner = run_subprocess) -> int:
    """Entry point: 0 when every trial finished, 1 when some failed, 2 on a bad grid."""
    try:
        args, cfg = parse(sys.argv[1:] if argv is None else argv)
    except SystemExit as exc:  # argparse already printed its one-line error (or --help)
        return int(exc.code or 0)
    try:
        with interrupts_as_keyboard():  # Ray's lazy import, for one
            resolve_backend(args.backend, cfg, args.address)
            trials = grid(cfg)
            validate(cfg, trials)
            if args.dry_run:
                for t in trials:
                    state = "complete, skipped" if is_finished(t) else "to run"
                    then = "".join(f"\n{' '.join(cmd)}" for cmd, _ in post_steps(t))
                    print(f"# {t.name}: {state}\n{' '.join(trial_command(t, cfg))}{then}")
                return 0
            ray_opts = RayOptions(address=args.address, num_cpus=args.num_cpus)
            outcomes = run_sweep(cfg, args.backend, runner, ray_opts, progress_every=args.progress_every)
    except SweepError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return EXIT_USAGE
    except KeyboardInterrupt:
        sys.stderr.write("\ninterrupted; re-run the same command to resume unfinished trials\n")
        return EXIT_INTERRUPTED
    failed = [o for o in outcomes if o.status == "failed"]
    print(f"sweep: {len(outcomes) - len(failed)}/{len(outcomes)} trials complete; runs in {cfg.out}")
    return EXIT_FAILED if failed else 0


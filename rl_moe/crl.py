"""``python -m rl_moe.crl``: train a method through a continual task suite.

Examples::

    python -m rl_moe.crl --suite smoke --algo td3 --method topk
    python -m rl_moe.crl --suite cw10 --tasks 2 --steps-per-task 32768     # the SPHERE paper's protocol
    python -m rl_moe.crl --suite cw10-cw --tasks 2 --steps-per-task 32768  # Continual World's rules
    python -m rl_moe.crl --resume runs/cw10/ppo-sphere-crl-s0-20260101-120000

``--list`` and ``--help`` print every built-in suite with its rules. ``cw10-paper`` is an alias of
``cw10``; until 2026-11-26 ``cw10`` named Continual World's rules (``cw10-cw`` now), and a run
folder made then resumes with the rules it recorded.

Exit codes: 0 done; 2 a user mistake, reported on one line before anything is written;
3 training produced a NaN/inf (one line naming the term, step and task; the run folder keeps
every finished task and resumes, e.g. with a changed ``--set``); 130 interrupted (Ctrl-C or SIGTERM), with
the command that resumes the run. See docs/continual.md, "Guarantees".
"""

from __future__ import annotations

import argparse
import dataclasses
import errno
import json
import os
import signal
import sys
from pathlib import Path


def _quit_during_startup(signum: int, frame: object) -> None:
    sys.stderr.write("\ninterrupted\n")
    os._exit(130)


def _interrupt_once(signum: int, frame: object) -> None:
    """The first Ctrl-C or SIGTERM raises KeyboardInterrupt (the run writes its last rollout
    boundary and exits 130); later ones are ignored, so a second signal during the clean-up
    cannot escape the handler and change the exit code."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise KeyboardInterrupt


if __name__ == "__main__":  # Ctrl-C while the heavy imports below load exits as cleanly as later
    signal.signal(signal.SIGINT, _quit_during_startup)

import torch  # noqa: E402

from rl_moe.cli import EXIT_INTERRUPTED, EXIT_USAGE, UsageParser, interrupts_as_keyboard  # noqa: E402
from rl_moe.continual.config import OVERRIDE_PRESETS, PRESET_DESCRIPTIONS, RunConfig, preset_overrides  # noqa: E402
from rl_moe.continual.learners import LEARNERS, get_learner  # noqa: E402
from rl_moe.continual.methods import METHODS, get_method  # noqa: E402
from rl_moe.continual.networks import FALLBACK_NETWORK  # noqa: E402
from rl_moe.continual.resolve import DEVICES, RunRequest, check_reference, resolve, rules_tag, suite_rules  # noqa: E402
from rl_moe.continual.resume import check_flags_match, check_resumable, extend_tasks, load_run, saved_progress, with_overrides  # noqa: E402
from rl_moe.continual.run_view import RunView  # noqa: E402
from rl_moe.continual.scheduler import ContinualScheduler  # noqa: E402
from rl_moe.envs.suites import SUITE_ALIASES, builtin_suites, current_suite_name, load_suite  # noqa: E402
from rl_moe.envs.threads import ThreadPlan, parse_threads, split_threads, thread_plan  # noqa: E402
from rl_moe.errors import DivergedError, UsageError  # noqa: E402
from rl_moe.report.grouping import describe_rules  # noqa: E402
from rl_moe.rundir import RunDir, check_new_run_folder, check_writable_folder  # noqa: E402
from rl_moe.runlock import RunLock, RunLocked  # noqa: E402

EXIT_DIVERGED = 3
EXIT_STORAGE = 4
#: Storage failures that a resume gets past once the disk is fixed (full, failing, read-only, quota).
_STORAGE_ERRNOS = frozenset({errno.ENOSPC, errno.EIO, errno.EROFS, errno.EDQUOT})
_DEFAULTS: dict[str, object] = {"suite": "cw10", "algo": "ppo", "method": "sphere", "protocol": "crl", "seed": 0, "device": "auto"}


def build_parser() -> argparse.ArgumentParser:
    p = UsageParser(
        prog="python -m rl_moe.crl", description="Continual RL with MoE policies: train a method through a task suite.",
        epilog="\n".join(["built-in suites:", *_suite_lines()]), formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    p.add_argument("--suite", default=None, help=f"built-in suite ({', '.join(builtin_suites())}; default cw10, the SPHERE paper's protocol) or a suite .json path")
    p.add_argument("--algo", default=None, help=f"learner: {', '.join(LEARNERS)}")
    p.add_argument("--method", default=None, help=f"network + regularizers: {', '.join(METHODS)}")
    p.add_argument("--protocol", default=None, help="crl: one agent through the tasks; rl: fresh agent per task")
    p.add_argument("--seed", type=int, default=None, help="run seed (default 0)")
    p.add_argument("--steps-per-task", type=int, default=None, help="env steps per task (default: the suite's budget)")
    p.add_argument("--tasks", type=int, default=None, help="train only the first N tasks of the suite")
    p.add_argument("--device", default=None, help=f"torch device: {', '.join(DEVICES)}")
    p.add_argument("--vec-env", default="auto", help="auto (MetaWorld with EnvPool installed: each task on the faster of EnvPool and the official envs, measured at its start; otherwise in-process on <= 2 cores, worker processes on more), dummy, subproc or envpool")
    p.add_argument("--experts", type=int, default=None, help="number of experts E (default 10)")
    p.add_argument("--top-k", type=int, default=None, help="active experts K <= E (default 2)")
    p.add_argument("--out", default="runs", help="runs root folder (default: runs)")
    p.add_argument("--run-dir", default=None, help="explicit run folder; an existing run there is resumed")
    p.add_argument("--resume", default=None, metavar="RUN_DIR", help="continue a run after its last finished task")
    p.add_argument("--reference", default=None, metavar="RUN_DIR", help="RL-protocol run for forward transfer")
    p.add_argument(
        "--preset", default=None,
        help=f"override bundle applied before --set: {', '.join(OVERRIDE_PRESETS)}. cw10, cw20 and hb5 build the SPHERE authors' network "
        "(LeCun init, 3 x 256 gate) with no preset, other suites sb3's; SPHERE takes the authors' lambda arithmetic on every suite "
        "(--list describes each preset)",
    )  # fmt: skip
    p.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
        help="override a config field: net.hidden=32,32  ppo.n_steps=64  eval.n_episodes=2  reg.sphere.rho=0.01 "
        "(also on --resume: the run continues with the changed setting)",
    )  # fmt: skip
    p.add_argument(
        "--threads", default="auto",
        help="torch CPU threads, or auto (default): 1 on the official envs; on EnvPool 2 while the load average leaves 2 cores free, "
        "else 1, checked before every rollout; EnvPool's workers get every core. A set OMP_NUM_THREADS is kept under auto",
    )  # fmt: skip
    p.add_argument("--no-progress", action="store_true", help="no progress line on stderr")
    p.add_argument("--list", action="store_true", help="list suites and methods, then exit")
    return p


def _suite_lines() -> list[str]:
    """Each built-in suite with its rules (under PPO) and its one-line description."""
    lines = []
    for name in builtin_suites():
        suite = load_suite(name)
        aliases = [a for a, target in SUITE_ALIASES.items() if target == name]
        also = f" (also: {', '.join(aliases)})" if aliases else ""
        network = f"{suite.network or FALLBACK_NETWORK} network"
        lines.append(f"  {name}{also}: {len(suite.tasks)} tasks, {network}, {describe_rules(suite_rules(suite, 'ppo'))}. {suite.description}")
    return lines


def _listing() -> str:
    lines = ["suites:", *_suite_lines(), "methods:"]
    lines += [f"  {m.name:<14} {m.description}" for m in METHODS.values()]
    lines += ["presets (--preset; later --set wins):", *(f"  {name:<14} {PRESET_DESCRIPTIONS[name]}" for name in OVERRIDE_PRESETS)]
    return "\n".join(lines)


def _new_run_dir(cfg: RunConfig, out: str) -> Path:
    base = Path(out) / cfg.suite_name / f"{cfg.algo}-{cfg.method}-{cfg.protocol}{rules_tag(cfg)}-s{cfg.seed}-{cfg.created}"
    path, n = base, 1
    while path.exists():  # two runs started in the same second
        path, n = base.with_name(f"{base.name}-{n}"), n + 1
    return path


def _has_finished_task(run_dir: Path) -> bool:
    try:
        return int(json.loads(RunDir(run_dir).results.read_text())["finished_tasks"]) > 0
    except (OSError, ValueError, KeyError, TypeError):
        return RunDir(run_dir).results.is_file()  # unreadable: keep it, resume reports it


def prepare(args: argparse.Namespace) -> tuple[RunConfig, Path]:
    """Resolve the run (all validation) and return its config and folder; writes nothing."""
    resume_dir = args.resume
    if resume_dir is None and args.run_dir is not None and RunDir(args.run_dir).config.is_file():
        resume_dir = args.run_dir
        try:
            load_run(Path(resume_dir))
        except UsageError:
            if not _has_finished_task(Path(resume_dir)):
                resume_dir = None  # killed while the folder was being created: start it again
    if resume_dir is not None:
        run_dir = Path(resume_dir)
        if not run_dir.is_dir():
            raise UsageError(f"cannot resume {resume_dir!r}: no such run folder")
        cfg = extend_tasks(load_run(run_dir), args.tasks)
        check_flags_match(args, cfg)
        check_resumable(run_dir, cfg)
        if args.preset is not None:  # applied like --set, before it, as for a new run
            bundle = preset_overrides(args.preset, get_method(cfg.method).regularizers)
            cfg = dataclasses.replace(with_overrides(cfg, list(bundle), source=f"--preset {args.preset}"), preset=args.preset)
        if args.overrides:
            cfg = with_overrides(cfg, args.overrides)
        if args.reference is not None:  # safe to add: it only changes forward transfer
            check_reference(args.reference)
            cfg = dataclasses.replace(cfg, reference=str(Path(args.reference).resolve()))
        return cfg, run_dir
    args = argparse.Namespace(**{**vars(args), **{k: v for k, v in _DEFAULTS.items() if vars(args)[k] is None}})
    req = RunRequest(
        suite=args.suite, algo=args.algo, method=args.method, protocol=args.protocol, seed=args.seed,
        steps_per_task=args.steps_per_task, tasks=args.tasks, device=args.device, vec_env=args.vec_env,
        n_experts=args.experts, top_k=args.top_k, reference=args.reference, preset=args.preset, overrides=tuple(args.overrides),
    )  # fmt: skip
    cfg = resolve(req)
    run_dir = Path(args.run_dir) if args.run_dir is not None else _new_run_dir(cfg, args.out)
    return cfg, run_dir


def _rollout_note(cfg: RunConfig) -> str:
    """Learners that train whole rollouts (PPO): say so when the step budget is not a multiple of one."""
    actual = cfg.effective_steps_per_task
    if actual == cfg.steps_per_task:
        return ""
    spec = get_learner(cfg.algo)
    rollout = spec.rollout(cfg.learner_settings)
    return f"note: {spec.name.upper()} collects {rollout:,}-step rollouts, so each task runs {actual:,} steps (asked: {cfg.steps_per_task:,})"


def _renamed_note(cfg: RunConfig) -> str:
    """A run folder recorded under a built-in name whose rules have changed since keeps its own."""
    today = current_suite_name(cfg.suite_name, cfg.suite_data.get("episode_length"))
    if today == SUITE_ALIASES.get(cfg.suite_name, cfg.suite_name):
        return ""
    return f"note: this run was made under {cfg.suite_name!r} before that name became the SPHERE paper's protocol; it keeps the rules it recorded, which are {today!r}'s now"


def _summary(results: dict) -> str:
    own = ", ".join("-" if v is None else f"{v:.2f}" for v in results["own_success"])
    text = f"own-task success: [{own}]"
    m = results["cl_metrics"]
    if results["complete"] and m["average_performance"] is not None:
        ft = "n/a" if m["forward_transfer"] is None else f"{m['forward_transfer']:.3f}"
        text += f"\naverage performance {m['average_performance']:.3f}, forgetting {m['forgetting']:.3f}, forward transfer {ft}"
    return text


def main(argv: list[str] | None = None) -> int:
    """CLI entry point; returns the exit code (0 ok, 2 usage error, 130 interrupted)."""
    args = build_parser().parse_args(argv)
    if args.list:
        print(_listing())
        return 0
    try:
        cfg, run_dir = prepare(args)
    except UsageError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return EXIT_USAGE
    results_path = RunDir(run_dir).results
    done = json.loads(results_path.read_text()) if results_path.is_file() else {}
    if done.get("complete") and len(done.get("tasks", ())) >= len(cfg.tasks):
        ignored = f" (ignored: {', '.join('--set ' + o for o in args.overrides)})" if args.overrides else ""
        print(f"run {run_dir} is already complete; nothing to do{ignored}")
        return 0
    try:
        asked = parse_threads(args.threads)
        plan, note = thread_plan(asked)
        threads = split_threads(asked, cfg.vec_env, cfg.learner_settings.n_envs)
    except UsageError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return EXIT_USAGE
    try:
        named = next((flag, value) for flag, value in (("--resume", args.resume), ("--run-dir", args.run_dir), ("--out", args.out)) if value is not None)
        if args.resume is None and args.run_dir is not None and str(args.run_dir).strip():
            check_new_run_folder(args.run_dir)  # first: a refused folder of the user's files is left untouched
        check_writable_folder(named[1], named[0])
    except ValueError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return EXIT_USAGE

    if note is not None:
        sys.stderr.write(note + "\n")
    plan = dataclasses.replace(plan, pool_threads=threads[1])
    # a suite whose tasks the pool never serves (the paper's fixed positions) starts on the official envs' threads
    torch.set_num_threads(plan.for_task(native=RunView(cfg, run_dir).uses_pool))

    try:  # checked writable above; a folder that vanishes or a full disk can still refuse it
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        sys.stderr.write(f"error: cannot make the run folder {str(run_dir)!r} ({exc.strerror or exc})\n")
        return EXIT_USAGE
    try:  # before anything is written: a second writer would mix its files into the first's
        lock = RunLock(run_dir).acquire()
    except RunLocked as exc:
        sys.stderr.write(f"error: {exc}\n")
        return EXIT_USAGE
    try:
        return _train(args, cfg, run_dir, int(done.get("finished_tasks", 0)), plan)
    finally:
        lock.release()


def _train(args: argparse.Namespace, cfg: RunConfig, run_dir: Path, finished: int, threads: ThreadPlan) -> int:
    """Write the config and train (``finished`` tasks are done); the caller holds the folder's lock."""

    resume_cmd = f"python -m rl_moe.crl --resume {run_dir.resolve()}"
    results_path = RunDir(run_dir).results
    for tmp in RunDir(run_dir).stale_temp_files():  # the lock makes them no live writer's
        tmp.unlink(missing_ok=True)
    stored = RunDir(run_dir).config
    on_ready = None
    if not stored.is_file() or stored.read_text() != json.dumps(cfg.to_dict(), indent=2) + "\n":
        if finished and stored.is_file():  # --set on a resume: rewrite once the learner has loaded with it
            on_ready = lambda: cfg.save(str(stored))  # noqa: E731
        else:  # a new run, or a restarted partial folder
            cfg.save(str(stored))
    print(f"run folder: {run_dir}", flush=True)
    if finished:
        print(f"resuming at task {finished + 1}/{len(cfg.tasks)} ({finished} finished)", flush=True)
    for note in (_rollout_note(cfg), _renamed_note(cfg)):
        if note:
            print(note, flush=True)
    tb_before = set(RunDir(run_dir).tb.glob("events.*"))
    loaded: list[bool] = []

    def ready() -> None:
        loaded.append(True)
        if on_ready is not None:
            on_ready()

    try:
        with interrupts_as_keyboard():
            results = ContinualScheduler(cfg, run_dir, progress=not args.no_progress, on_model_ready=ready, threads=threads).run()
    except KeyboardInterrupt:
        saved = saved_progress(run_dir, len(cfg.tasks), get_learner(cfg.algo).in_task_checkpoints)
        sys.stderr.write(f"\ninterrupted; {saved}. Resume with: {resume_cmd}\n")
        return EXIT_INTERRUPTED
    except DivergedError as exc:
        sys.stderr.write(f"\nerror: {exc}; finished tasks are kept: change the setting and resume with {resume_cmd} --set KEY=VALUE\n")
        return EXIT_DIVERGED
    except OSError as exc:
        if exc.errno not in _STORAGE_ERRNOS:
            raise
        kept = json.loads(results_path.read_text()).get("finished_tasks", 0) if results_path.is_file() else 0
        where = f" writing {exc.filename}" if exc.filename else ""
        sys.stderr.write(f"\nerror: {exc.strerror}{where}; the {kept} finished task(s) and their checkpoints are kept (every file is replaced atomically); fix the disk and resume with {resume_cmd}\n")
        return EXIT_STORAGE
    except Exception as exc:
        if on_ready is None or loaded:
            raise
        # A changed setting passed validation but the stored run does not load with it: nothing
        # of this attempt stays (config.json is only rewritten once the learner has loaded).
        for events in set(RunDir(run_dir).tb.glob("events.*")) - tb_before:
            events.unlink(missing_ok=True)
        detail = (str(exc).strip().splitlines() or [""])[0][:200]
        sys.stderr.write(f"error: the run does not load with the changed settings ({type(exc).__name__}: {detail}); config.json is unchanged: resume without them or start a new run\n")
        return EXIT_USAGE
    print(_summary(results.to_dict()))
    print(f"results: {results_path}")
    return 0


def _entry() -> int:
    # Ctrl-C during start-up or shutdown (outside the training loop's handler) exits as cleanly.
    try:
        with interrupts_as_keyboard():
            return main()
    except KeyboardInterrupt:
        sys.stderr.write("\ninterrupted\n")
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    os.environ.setdefault("PYTHONWARNINGS", "ignore::DeprecationWarning")
    signal.signal(signal.SIGINT, _interrupt_once)
    signal.signal(signal.SIGTERM, _interrupt_once)  # a cluster's preemption: saved like a Ctrl-C
    code = _entry()
    if code == EXIT_INTERRUPTED:
        # Leave without the interpreter's shutdown (atexit hooks, finalizers), where a late
        # KeyboardInterrupt would make Python re-raise SIGINT (exit status -2 instead of 130).
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(EXIT_INTERRUPTED)
    sys.exit(code)

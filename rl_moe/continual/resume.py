"""Resuming a run folder: everything checked before a resume writes anything (docs/continual.md,
"Interrupting and resuming"): the stored config and its names, the results file, every finished
checkpoint (readable, and fitting the config's network), the probe batch, the flags given again,
and ``--set``/``--preset`` on the stored settings.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path
from typing import Any

import torch
from stable_baselines3.common.save_util import load_from_zip_file
from stable_baselines3.common.vec_env import DummyVecEnv

from rl_moe.cli import reraise_interrupt
from rl_moe.continual.agents import build_model
from rl_moe.continual.config import RunConfig, apply_overrides, regularizer_configs
from rl_moe.continual.learners import get_learner
from rl_moe.continual.methods import get_method
from rl_moe.continual.resolve import PROTOCOLS, check_sections, first_tasks, suite_of
from rl_moe.continual.results import Results
from rl_moe.continual.state_files import checkpoint_ok, load_regularizer_state
from rl_moe.continual.rng import load as load_training_state
from rl_moe.continual.run_view import RunView
from rl_moe.envs import envpool_env
from rl_moe.envs.envpool_env import INSTALL_HINT
from rl_moe.envs.factories import task_factories
from rl_moe.envs.suites import SUITE_ALIASES, current_suite_name
from rl_moe.errors import MissingDependencyError, UsageError, check_choice
from rl_moe.rundir import RunDir

#: Flags that define a run: on ``--resume`` the stored values hold, and a differing flag is refused.
_RUN_FLAGS: dict[str, str] = {
    "suite": "suite", "algo": "algo", "method": "method", "protocol": "protocol", "seed": "seed",
    "steps_per_task": "steps_per_task", "device": "device",
}  # fmt: skip

def load_run(run_dir: Path) -> RunConfig:
    path = RunDir(run_dir).config
    if not path.is_file():
        raise UsageError(f"cannot resume {str(run_dir)!r}: no {path.name} there (not a run folder)")
    try:
        cfg = RunConfig.from_dict(json.loads(path.read_text()))
    except (json.JSONDecodeError, TypeError, ValueError) as exc:
        raise UsageError(f"cannot resume {str(run_dir)!r}: bad {path.name} ({exc})") from None
    try:  # names a new run would have refused (a hand-edited file)
        get_method(cfg.method)
        get_learner(cfg.algo)
        check_choice(cfg.protocol, PROTOCOLS, "protocol")
        suite_of(cfg)
    except UsageError as exc:
        raise UsageError(f"cannot resume {str(run_dir)!r}: bad {path.name}: {exc}") from None
    return cfg


def _check_weights(run_dir: Path, cfg: RunConfig, checkpoints: list[Path], probe: Any) -> None:
    """Finished checkpoints must load into the network the config builds, and the probe batch
    must have the env's observation width (a mismatch would fail mid-run, or silently drop the
    plasticity metrics for the rest of it)."""

    suite = suite_of(cfg)
    env = DummyVecEnv(task_factories(suite, suite.tasks[0], 1, 0))
    try:
        obs_dim = int(env.observation_space.shape[0])
        if probe is not None and probe.shape[1] != obs_dim:
            raise UsageError(f"cannot resume {str(run_dir)!r}: probe_states.pt holds {probe.shape[1]}-dim states, the env gives {obs_dim}; delete it (it is collected again)")
        if not checkpoints:
            return
        expected = {k: tuple(v.shape) for k, v in build_model(cfg, env, "cpu").policy.state_dict().items()}
    finally:
        env.close()
    for ckpt in checkpoints:
        try:
            _, params, _ = load_from_zip_file(str(ckpt), device="cpu")
            got = {k: tuple(v.shape) for k, v in params["policy"].items()}
        except Exception as exc:  # torch and pickle raise many types for a damaged member
            reraise_interrupt(exc)
            raise UsageError(f"cannot resume {str(run_dir)!r}: checkpoint {str(ckpt)!r} has unreadable weights ({type(exc).__name__}); restore it or start a new run") from None
        if got != expected:
            bad = next((k for k in expected if got.get(k) != expected[k]), next(iter(set(got) - set(expected)), "?"))
            raise UsageError(f"cannot resume {str(run_dir)!r}: checkpoint {str(ckpt)!r} does not fit config.json's network (first mismatch: {bad}); restore it or start a new run")


def check_resumable(run_dir: Path, cfg: RunConfig) -> None:
    """A resumed run's results and finished-task checkpoints must be readable, and its env
    backend installed (a resume may not change the backend: the tasks left would differ)."""
    if RunView(cfg, run_dir).uses_pool and not envpool_env.envpool_installed():  # at call time, like envs.resolve_vec_env_type
        raise MissingDependencyError(f"cannot resume {str(run_dir)!r}: it steps or evaluates its envs with envpool ({cfg.vec_env}), which is not installed; install it with: {INSTALL_HINT}")
    files = RunDir(run_dir)
    path = files.results
    if not path.is_file():
        return
    try:
        results = Results.from_dict(json.loads(path.read_text()))
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        raise UsageError(f"cannot resume {str(run_dir)!r}: corrupt {path.name} ({exc!r}); restore it or start a new run") from None
    probe = files.probe_states
    if probe.is_file():
        try:
            states = torch.load(probe, map_location="cpu", weights_only=True)
        except Exception as exc:  # torch raises several types for a damaged file
            reraise_interrupt(exc)
            raise UsageError(f"cannot resume {str(run_dir)!r}: corrupt {probe.name} ({type(exc).__name__}); delete it (it is collected again) or start a new run") from None
        if not isinstance(states, torch.Tensor) or states.ndim != 2:
            raise UsageError(f"cannot resume {str(run_dir)!r}: {probe.name} is not an (N, obs_dim) tensor; delete it (it is collected again)")
    else:
        states = None
    checkpoints = []
    for i in range(min(results.finished_tasks, len(cfg.tasks))):
        ckpt = files.checkpoint(i, cfg.tasks[i])
        if not checkpoint_ok(ckpt):
            raise UsageError(
                f"cannot resume {str(run_dir)!r}: checkpoint {str(ckpt)!r} of finished task {i} is missing or corrupt "
                "(not a readable SB3 .zip); restore it or start a new run"
            )
        try:
            load_regularizer_state(RunDir.regularizer_state(ckpt))
            load_training_state(RunDir.training_state(ckpt))
        except ValueError as exc:
            raise UsageError(f"cannot resume {str(run_dir)!r}: {exc}; restore it or start a new run") from None
        checkpoints.append(ckpt)
    if checkpoints or states is not None:
        _check_weights(run_dir, cfg, checkpoints, states)


def extend_tasks(cfg: RunConfig, tasks: int | None) -> RunConfig:
    """``--tasks N`` on a run stored with fewer tasks: the same run continued through the suite's
    next tasks (a three-task CRL slice grows into the full CW10 sequence without retraining its
    first tasks). Fewer or equal tasks leave ``cfg`` as stored (fewer is refused by
    :func:`check_flags_match`)."""
    if tasks is None or tasks <= len(cfg.tasks):
        return cfg
    return dataclasses.replace(cfg, tasks=first_tasks(suite_of(cfg), tasks))


def _same_suite(given: str, cfg: RunConfig) -> bool:
    """``--suite`` names the suite a resumed run recorded: the name it was started with, or
    today's name of its rules, or an alias of that. A folder made under ``cw10`` before it became
    the paper's protocol resumes, with the rules it recorded, under ``--suite cw10`` as typed
    then or under ``--suite cw10-cw``."""
    today = current_suite_name(cfg.suite_name, cfg.suite_data.get("episode_length"))
    return given == cfg.suite or SUITE_ALIASES.get(given, given) == today


def check_flags_match(args: argparse.Namespace, cfg: RunConfig) -> None:
    """A resumed run keeps its stored settings; refuse flags that ask for different ones."""
    stored = {"suite": cfg.suite, "algo": cfg.algo, "method": cfg.method, "protocol": cfg.protocol, "seed": cfg.seed,
              "steps_per_task": cfg.steps_per_task, "device": cfg.device}  # fmt: skip
    stored.update(tasks=len(cfg.tasks), experts=cfg.net.n_experts, top_k=cfg.net.top_k, vec_env=cfg.vec_env)
    given_flags = {name: vars(args)[name] for name in (*_RUN_FLAGS, "tasks", "experts", "top_k")}
    given_flags["vec_env"] = None if args.vec_env == "auto" else args.vec_env
    if given_flags["suite"] is not None and _same_suite(given_flags["suite"], cfg):
        given_flags["suite"] = None  # an alias, or today's name of the rules the run recorded
    for name, given in given_flags.items():
        key = _RUN_FLAGS.get(name, name)
        if given is not None and given != stored[key]:
            flag = "--" + name.replace("_", "-")
            raise UsageError(f"{flag} {given} conflicts with the resumed run's stored {stored[key]!r}; drop {flag} (the stored value is kept) or start a new run")
    if args.resume is not None and args.run_dir is not None and Path(args.run_dir).resolve() != Path(args.resume).resolve():
        raise UsageError(f"--run-dir {args.run_dir} differs from --resume {args.resume}; give one of them")


def with_overrides(cfg: RunConfig, overrides: list[str], source: str = "--set") -> RunConfig:
    """``--set`` (or a ``--preset`` bundle) on a resume: the stored config with the overrides,
    validated like a new run's.

    ``net.*`` settings define the parameter shapes the checkpoints hold: one that changes the
    stored value would make the run unloadable, so it is refused before anything is written (the
    same command repeated to resume a run passes the stored values again, which is fine).
    """

    regs_used = get_method(cfg.method).regularizers
    sections = cfg.sections()
    sections, regs = apply_overrides(sections, cfg.regularizers, overrides, used=regs_used)
    if sections["net"] != cfg.net:
        changed = next((o for o in overrides if o.split("=", 1)[0].strip().startswith("net.")), "net.*")
        what = f"--set {changed}" if source == "--set" else f"{source} (its {changed})"
        raise UsageError(f"{what} cannot change a resumed run: net.* settings fix the shapes of its checkpoints; start a new run to change them")
    check_sections(sections)
    # A config.json without one of the method's regularizers (none this version writes) gets its defaults.
    regs = {**regularizer_configs([name for name in regs_used if name not in regs], {}), **regs}
    return dataclasses.replace(cfg, regularizers={name: regs[name] for name in regs_used}, **sections)


def saved_progress(run_dir: Path, n_tasks: int, resumes_inside: bool) -> str:
    """What an interrupted run left on disk for a resume, in words: its finished tasks, and how far
    the unfinished one's in-task checkpoint got (read from results.json and ``in_task.pkl`` after
    the interruption's clean-up wrote what it could).

    :param resumes_inside: the learner writes in-task checkpoints (PPO; a TD3 run restarts its
        unfinished task)
    """
    files = RunDir(run_dir)
    try:
        data = json.loads(files.results.read_text())
        finished, evaluated, in_task = int(data.get("finished_tasks", 0)), data.get("evaluated_tasks"), data.get("in_task")
    except (OSError, ValueError, TypeError, AttributeError):
        finished, evaluated, in_task = 0, None, None
    if finished >= n_tasks:
        return f"all {n_tasks} tasks are trained and saved; a resume evaluates what is left"
    task = f"task {finished + 1}/{n_tasks}"
    done = "" if finished == 0 else ("task 1 is saved" if finished == 1 else f"tasks 1-{finished} are saved")
    if evaluated is not None and int(evaluated) < finished:
        done += f" (task {finished}'s evaluation runs again on resume)"
    if isinstance(in_task, dict) and files.in_task.is_file():
        step = int(in_task["step"]) - int(in_task["task_start"])
        return f"{done + ', and ' if done else ''}{task} is saved up to its step {step:,}, where a resume continues"
    why = f"{task} stopped before its first update had finished" if resumes_inside else f"the learner keeps no in-task checkpoint of {task}"
    return f"{done + '; ' if done else 'nothing was saved: '}{why}, so a resume starts it from its first step"

"""The continual-task scheduler (SPHERE §5.1): one agent through the tasks (CRL) or a fresh agent
per task (RL), with evaluation, checkpoints, ``results.json`` and resume. This module is the main
loop and the model; each task's envs (:mod:`~rl_moe.continual.scheduler_envs`), its evaluation
(:mod:`~rl_moe.continual.scheduler_eval`) and the run folder's files
(:mod:`~rl_moe.continual.scheduler_files`) are mixins of :class:`ContinualScheduler`.

CRL keeps the *whole* learner between tasks: parameters, the Adam state and the global step
(the paper resumes "from the final parameters of the previous task"; keeping the optimizer's
moments avoids a reset that would itself act as a plasticity intervention). TD3's replay buffer
is emptied at each task boundary and is never checkpointed. Beside each checkpoint the
regularizers' internal state (``*.regularizers.pt``) is saved, so a resumed run continues them too.
"""

from __future__ import annotations

import copy
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from stable_baselines3.common.base_class import BaseAlgorithm
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.logger import Logger, TensorBoardOutputFormat
from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv, VecEnv, VecNormalize

from rl_moe.algos.common import RegularizedMixin
from rl_moe.algos.guard import NonFiniteError, diagnose
from rl_moe.cli import interrupts_as_keyboard
from rl_moe.continual import intask, rng
from rl_moe.continual.agents import begin_task, build_model
from rl_moe.continual.config import RunConfig
from rl_moe.continual.evaluation import EvalEnvs, PeriodicEval, fix_mmap_threshold
from rl_moe.continual.intask import InTaskCheckpoint
from rl_moe.continual.learners import get_learner
from rl_moe.continual.probe_states import default_probe_policy, load_or_collect, make_probe_callback, probe_factories
from rl_moe.continual.progress import Pace, ProgressLine
from rl_moe.continual.resolve import suite_of
from rl_moe.continual.run_view import RunView
from rl_moe.continual.results import Results, reference_aucs
from rl_moe.continual.scheduler_envs import TaskEnvs
from rl_moe.continual.scheduler_eval import SUCCESS_AFTER_TASK, TASK_INDEX_TAGS, TaskEvaluation  # noqa: F401  (the tags' names, imported from here)
from rl_moe.continual.scheduler_files import RunFiles
from rl_moe.envs.factories import announce_fallbacks, may_pool
from rl_moe.envs.families import get_family
from rl_moe.envs.stages import EpisodeStages
from rl_moe.envs.threads import KEEP_THREADS, ThreadGovernor, ThreadPlan, available_cores
from rl_moe.errors import DivergedError
from rl_moe.provenance import code_version, cpu_model, vec_env_backend
from rl_moe.rundir import RunDir
from rl_moe.tblog import logged_at, tensorboard_logger


@dataclass
class TaskRun:
    """One task trained in this session, handed from :meth:`ContinualScheduler.run` through
    training to its evaluation (nothing of it is kept on the scheduler)."""

    index: int
    start: int  # the global step at the task's start
    resume: dict[str, Any] | None = None  # the in-task checkpoint it continues from (None: from its start)
    log_start_eval: bool = True  # False: the interrupted run already logged the start evaluation
    seconds: float = float("nan")  # training time, with the time trained before an in-task resume

    @property
    def resumed_step(self) -> int | None:
        """The global step the task continues from, or None when it starts afresh."""
        return None if self.resume is None else int(self.resume["step"])

    @property
    def seconds_before(self) -> float:
        """Training time spent on the task before this session (0 when it starts afresh)."""
        return 0.0 if self.resume is None else float(self.resume["seconds"])


@dataclass
class TaskCallbacks:
    """What one task's ``learn`` runs with: its callbacks, and the parts the task reads after."""

    callbacks: list[BaseCallback]
    curve: dict[str, list]  # the periodic evaluation's points, filled in place
    line: ProgressLine | None
    checkpoint: InTaskCheckpoint | None


def resolve_device(device: str) -> str:
    """``auto`` -> ``cuda`` when available, else ``cpu``."""
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


class ContinualScheduler(TaskEnvs, TaskEvaluation, RunFiles):
    """Trains, evaluates and checkpoints a run described by ``cfg`` inside ``run_dir``.

    :param cfg: resolved run configuration (``config.json`` of the run)
    :param run_dir: the run folder (exists; may hold a partial run to resume)
    :param progress: draw the progress line on stderr
    :param callbacks: extra SB3 callbacks attached to every task's ``learn`` (tests, tools)
    :param threads: the run's thread plan (``--threads``): torch's threads per task and the native
        pool's workers; the default leaves torch's threads alone
    """

    def __init__(
        self,
        cfg: RunConfig,
        run_dir: Path,
        progress: bool = True,
        callbacks: list[BaseCallback] | None = None,
        on_model_ready: Callable[[], None] | None = None,
        threads: ThreadPlan = KEEP_THREADS,
    ) -> None:
        self.cfg, self.run_dir, self.progress = cfg, Path(run_dir), progress
        self.threads = threads  # torch's per task and the native pool's workers (the CLI's --threads)
        #: Called once, when the first learner of this session is built and loaded (the CLI
        #: rewrites a resumed run's config.json only then, so a setting that breaks loading
        #: leaves the stored one intact).
        self.on_model_ready = on_model_ready
        self.files = RunDir(run_dir)
        self.extra_callbacks = list(callbacks or [])
        self.suite = suite_of(cfg)
        self.view = RunView(cfg, self.run_dir)  # tasks, eval envs, saved statistics: as the tools read them
        self.tasks = self.view.tasks
        self.device = resolve_device(cfg.device)
        self.algo_cfg: Any = cfg.learner_settings
        self.results = self._load_results()
        self.model: BaseAlgorithm | None = None
        self.env: VecEnv | None = None
        self.logger: Logger | None = None
        self._eval_envs: dict[tuple[int, bool | None], EvalEnvs] = {}
        self._backend = self._fixed_backend()  # the current task's training backend (--vec-env auto: per task)
        self._pace = Pace()  # what the progress line's ETA has measured so far
        # Generator states and counters at the last task boundary (see rl_moe.continual.rng).
        self._boundary_state: dict[str, Any] | None = None

    # ---- setup -----------------------------------------------------------------------------
    def _load_results(self) -> Results:
        path = self.files.results
        cfg = self.cfg
        if path.is_file():
            res = Results.from_dict(json.loads(path.read_text()))
            res.rules = res.rules or cfg.rules()  # a run begun before results.json held its rules
            if len(cfg.tasks) > len(res.tasks):  # resumed with a larger --tasks (resume.extend_tasks)
                res.extend(list(cfg.tasks))
            return res
        # The steps a task really runs (PPO rounds the budget up to whole rollouts).
        return Results(cfg.suite_name, cfg.algo, cfg.method, cfg.protocol, cfg.seed, list(cfg.tasks), cfg.effective_steps_per_task, rules=cfg.rules())

    # ---- main loop ---------------------------------------------------------------------------
    def run(self) -> Results:
        """Train the remaining tasks; returns the final :class:`Results` (also on disk)."""
        cfg, res = self.cfg, self.results
        fix_mmap_threshold()  # before the model and the envs allocate: keeps RSS level over tasks
        res.save(self.files.results)
        if may_pool(cfg.vec_env):
            announce_fallbacks(self.suite, self.tasks)
        probe_states = None
        if cfg.probe.enabled:
            # Configs resolved before probe.policy existed hold "auto": resolve it the same way.
            policy = default_probe_policy(self.suite.family) if cfg.probe.policy == "auto" else cfg.probe.policy
            if not self.files.probe_states.is_file():  # seconds of scripted rollouts, with nothing else on screen
                print(f"collecting {cfg.probe.n_states:,} observations of the held-out tasks for the plasticity probe (once per run)", flush=True)
            probe_states = load_or_collect(self.files.probe_states, probe_factories(self.suite, self._seed("probe", 0)), cfg.probe.n_states, cfg.seed, policy, cfg.probe.noise, cfg.probe.stride)
        if cfg.reference is not None:
            res.reference_aucs = reference_aucs(cfg.reference, list(cfg.tasks))
        # A resume hides what the interrupted run logged past the last finished task.
        # The boundary step itself stays with the earlier run (its last update is logged there).
        fresh = res.finished_tasks == 0 and not any(self.files.tb.glob("events.*"))
        # The next task's start evaluation sits at the boundary step, which the purge keeps: skip it
        # only if the interrupted run got to log it (an interruption before it leaves a gap).
        started = res.finished_tasks > 0 and logged_at(str(self.files.tb), "eval/success", res.global_step)
        in_task = self._read_in_task()
        if in_task is not None:
            print(f"resuming task {res.finished_tasks + 1}/{len(self.tasks)} inside, at its step {in_task['step'] - in_task['task_start']:,}", file=sys.stderr)
        elif any(p.get("task") == res.finished_tasks for p in res.provenance) and not self.files.in_task.exists():
            # begun by an earlier process, which saved none of it (an unusable in-task checkpoint was named above)
            print(f"task {res.finished_tasks + 1}/{len(self.tasks)} starts from its first step: nothing of it was saved", file=sys.stderr)
        # The range this run trains again leaves the event files at the first write.
        restart = res.global_step + 1 if in_task is None else int(in_task["step"]) + 1
        self.logger = tensorboard_logger(str(self.files.tb), None if fresh else (0 if res.finished_tasks == 0 and in_task is None else restart))
        if res.finished_tasks == 0 and in_task is None:
            _log_config_table(self.logger, cfg)
        try:
            if res.evaluated_tasks is not None and res.evaluated_tasks < res.finished_tasks:
                self._finish_evaluation(res.finished_tasks - 1)
            first = res.finished_tasks
            for i in range(first, len(self.tasks)):
                # only the first task trained can continue an in-task checkpoint or have its start logged
                task = TaskRun(i, res.global_step, in_task if i == first else None, log_start_eval=not (started and i == first))
                self._train_task(task, probe_states)
            self._model_ready()  # only evaluation was left: nothing to load the settings into
            self._finish()
        finally:
            self._close_env()
            for envs in self._eval_envs.values():
                envs.close()
            self._eval_envs.clear()
            if self.logger is not None:
                self.logger.close()
        return res

    def _prepare_model(self, i: int, env: VecEnv) -> None:
        fresh = self.model is None or self.cfg.protocol == "rl"
        if fresh:
            self._build_model(env)
            if self.cfg.protocol == "crl" and i > 0:  # resume: continue from the last finished task
                self._load_finished(i - 1)
        else:
            assert self.model is not None
            self.model.set_env(env)
        assert self.model is not None
        begin_task(self.model, self.cfg, i, self.results.global_step)
        # Identical from here on whether or not the run was interrupted at this boundary: the
        # env's first reset seed, the generators and SB3's counters are set, not inherited.
        env.seed(self._seed("train", i))
        if self._boundary_state is not None and self.cfg.protocol == "crl":
            rng.restore(self.model, self._boundary_state)
        self._model_ready()

    def _model_ready(self) -> None:
        if self.on_model_ready is not None:
            ready, self.on_model_ready = self.on_model_ready, None
            ready()

    def _build_model(self, env: VecEnv) -> None:
        self.model = build_model(self.cfg, env, self.device)
        assert self.logger is not None
        self.model.set_logger(self.logger)

    def _load_finished(self, i: int) -> None:
        """Load finished task ``i``'s weights, regularizer state and boundary state into the model."""
        assert self.model is not None
        ckpt = self.view.checkpoint(i)
        self.model.set_parameters(str(ckpt), exact_match=True, device=self.device)
        self._load_regularizers(ckpt)
        state = rng.load(RunDir.training_state(ckpt))
        if state is None:
            print(f"note: no training state beside {ckpt.name}; the resumed run continues, but not bit for bit", file=sys.stderr)
        self._boundary_state = state

    def _finish_evaluation(self, i: int) -> None:
        """Evaluate finished task ``i``'s success-matrix row, whose run was interrupted after the
        checkpoint was written: the task is not trained again."""
        previous = self.load_vecnormalize(i) if self.algo_cfg.normalize_obs else None
        env = self._make_env(i, None, measure=False)
        if isinstance(env, VecNormalize) and isinstance(previous, VecNormalize):
            env.obs_rms, env.ret_rms = copy.deepcopy(previous.obs_rms), copy.deepcopy(previous.ret_rms)
        self.env = env
        self._build_model(env)
        self._load_finished(i)
        self._evaluate_and_store(i, train_seconds=float("nan"))

    def _train_task(self, task: TaskRun, probe_states: torch.Tensor | None) -> None:
        """Train ``task`` from its start or from its in-task checkpoint, then evaluate it."""
        cfg, res, i = self.cfg, self.results, task.index
        t0 = time.perf_counter()
        # The seconds before the progress line: say what fills them.
        model = " and the model" if self.model is None or cfg.protocol == "rl" else ""
        scored = f", then evaluating the policy on it before training ({cfg.eval.n_episodes} episodes)" if task.resume is None else ""
        print(f"{self._label(i)} building its envs{model}{scored}", flush=True)
        previous = self.env
        if previous is None and cfg.protocol == "crl" and i > 0 and self.algo_cfg.normalize_obs:
            previous = self.load_vecnormalize(i - 1)
        env = self._make_env(i, previous)
        if self.env is not None and self.env is not env:
            self._close_env()
        self.env = env
        self._prepare_model(i, env)
        assert self.model is not None
        start = task.start
        from_step = start if task.resumed_step is None else task.resumed_step
        res.provenance.append({"task": i, "name": self.tasks[i].name, "from_step": from_step, "backend": vec_env_backend(env, self.suite.family), **self._backend_record(), **code_version(), "cpu": cpu_model(), "cores": available_cores()})
        res.save(self.files.results)  # on disk before training: a rerun of this task keeps its backend
        hooks = self._task_callbacks(task, probe_states, env)
        self._learn(i, cfg.steps_per_task - (from_step - start), hooks)
        end = int(self.model.num_timesteps)
        if hooks.line is not None:  # the next task's ETA starts from this task's phases
            self._pace.phases = hooks.line.phases
        if isinstance(self.model, RegularizedMixin):  # the task's last update, at its step (before the checkpoint)
            self.model.flush_update_logs()
        trained = time.perf_counter()
        task.seconds = trained - t0 + task.seconds_before
        # The task is finished once its checkpoint is on disk: an interruption from here on
        # costs only the evaluation below, which a resume runs again.
        self._save_checkpoint(i)
        self._store_trained(i, start, end, hooks.curve)
        self.files.in_task.unlink(missing_ok=True)  # the task's own checkpoint supersedes it
        self._evaluate_and_store(i, task.seconds)
        self._pace.tail_seconds = time.perf_counter() - trained

    def _task_callbacks(self, task: TaskRun, probe_states: torch.Tensor | None, env: VecEnv) -> TaskCallbacks:
        """The callbacks of ``task``'s ``learn`` (periodic evaluation, threads, episode stages,
        probe, progress line, the caller's, in-task checkpoint), resumed from its in-task checkpoint if any."""
        cfg, i, start, in_task = self.cfg, task.index, task.start, task.resume
        curve: dict[str, list] = {"steps": [], "success": [], "return": []}
        every = max(1, cfg.steps_per_task // cfg.eval.evals_per_task)
        periodic = PeriodicEval(lambda: self._evaluate(i, cfg.eval.n_episodes), every, start + cfg.steps_per_task, curve, log_start=task.log_start_eval)
        callbacks: list[BaseCallback] = [periodic]
        base = env.venv if isinstance(env, VecNormalize) else env
        callbacks.append(ThreadGovernor(self.threads, native=not isinstance(base, (DummyVecEnv, SubprocVecEnv))))
        stage_keys = get_family(self.suite.family).stage_keys
        if stage_keys:
            callbacks.append(EpisodeStages(stage_keys))
        probe = None
        if probe_states is not None:
            probe = make_probe_callback(self._probe_input(probe_states), cfg.probe.every or every, cfg.seed, cfg.probe)
            callbacks.append(probe)
        line = None
        if self.progress:
            later = (len(self.tasks) - i - 1) * cfg.effective_steps_per_task
            line = ProgressLine(
                self._label(i), start, cfg.effective_steps_per_task, later_steps=later, later_tasks=len(self.tasks) - i - 1, pace=self._pace,
                # a resume inside the task skips the start evaluation: no guess until a tail is timed
                tail_per_start_eval=0.0 if in_task is not None else len(self._matrix_columns(i)) * cfg.eval.matrix_episodes / cfg.eval.n_episodes,
            )  # fmt: skip
            callbacks.append(line)
        callbacks.extend(self.extra_callbacks)
        checkpoint = None
        if get_learner(cfg.algo).in_task_checkpoints:

            def states() -> dict[str, Any]:
                return {"eval": periodic.state(), "probe": None if probe is None else probe.state()}

            checkpoint = InTaskCheckpoint(
                self.files.in_task, cfg.checkpoint, i, start, curve, states, resumed_at=task.resumed_step,
                seconds_before=task.seconds_before, on_write=lambda step: self._record_in_task(start, step),
            )  # fmt: skip
            callbacks.append(checkpoint)  # last: the boundary's evaluation is inside its capture
        if in_task is not None:
            assert self.model is not None
            curve.update(copy.deepcopy(in_task["curve"]))
            periodic.resume(in_task["callbacks"]["eval"])
            if probe is not None and in_task["callbacks"]["probe"] is not None:
                probe.resume(in_task["callbacks"]["probe"])
            if not intask.restore(self.model, env, in_task):
                print(f"note: the {self._backend.chosen.label} envs cannot save their state: task {i + 1} continues with fresh episodes (statistically the same run, not bit for bit)", file=sys.stderr)
        return TaskCallbacks(callbacks, curve, line, checkpoint)

    def _learn(self, i: int, steps: int, hooks: TaskCallbacks) -> None:
        """``learn`` task ``i`` for ``steps``: an interruption keeps the last rollout boundary, a
        NaN/inf becomes one :class:`DivergedError` naming the term."""
        assert self.model is not None
        try:
            with interrupts_as_keyboard():
                self.model.learn(total_timesteps=steps, reset_num_timesteps=False, callback=hooks.callbacks, log_interval=1)
        except KeyboardInterrupt:  # Ctrl-C or SIGTERM: keep the last rollout boundary
            if hooks.checkpoint is not None:
                hooks.checkpoint.flush()
            if hooks.line is not None:  # the line shows what a resume keeps, not the steps reached
                hooks.line.stopped(hooks.checkpoint.written_step if hooks.checkpoint is not None else self.model.num_timesteps)
            raise
        except (NonFiniteError, ValueError, RuntimeError) as exc:
            bad = diagnose(exc, self.model.policy.parameters())
            if bad is None:
                raise
            step = int(self.model.num_timesteps)
            raise DivergedError(f"{bad} at step {step} in task {i + 1} ({self.tasks[i].name})") from exc


def _flatten(data: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(data, dict):
        out: dict[str, Any] = {}
        for key, value in data.items():
            out.update(_flatten(value, f"{prefix}{key}."))
        return out
    return {prefix[:-1]: data}


def _log_config_table(logger: Logger, cfg: RunConfig) -> None:
    """The run's settings as a Markdown table in TensorBoard's text tab (CleanRL-style)."""
    rows = _flatten({k: v for k, v in cfg.to_dict().items() if k != "suite_data"})
    table = "|setting|value|\n|-|-|\n" + "\n".join(f"|{k}|{v}|" for k, v in sorted(rows.items()))
    for fmt in logger.output_formats:
        if isinstance(fmt, TensorBoardOutputFormat):
            fmt.writer.add_text("hyperparameters", table, 0)
            fmt.writer.flush()

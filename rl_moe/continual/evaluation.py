"""Deterministic evaluation of a policy on a suite task, and the periodic-eval SB3 callback.

Success follows the suite's rule through ``info["is_success"]`` (see
:mod:`rl_moe.envs.wrappers`): CW any-step ``info["success"]``, HB/smoke return >= bar.
"""

from __future__ import annotations

import copy
import ctypes
import gc
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import NamedTuple

import numpy as np
from stable_baselines3.common.base_class import BaseAlgorithm
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.policies import BasePolicy
from stable_baselines3.common.running_mean_std import RunningMeanStd
from stable_baselines3.common.vec_env import DummyVecEnv, VecEnv, VecNormalize

from rl_moe.algos.update import no_distribution_checks
from rl_moe.envs.factories import EnvFactory, make_vec_env, may_pool
from rl_moe.nn.reuse import weights_fixed
from rl_moe.tblog import dump_keys


class EvalResult(NamedTuple):
    """Outcome of an evaluation.

    :param success: fraction of successful episodes (the suite's rule: MetaWorld, at any step)
    :param mean_return: mean undiscounted episode return (raw rewards)
    :param n_episodes: episodes run
    :param success_last: fraction successful at the episode's last step (``info["success_last"]``
        where the env gives it, else the same as ``success``); None when not measured
    :param env_success: ``success`` per eval env, in the envs' order (empty when not measured)
    :param env_success_last: ``success_last`` per eval env (the SPHERE authors read envs 0 and 1)
    """

    success: float
    mean_return: float
    n_episodes: int
    success_last: float | None = None
    env_success: tuple[float, ...] = ()
    env_success_last: tuple[float, ...] = ()

    def per_env(self) -> dict[str, list[float]]:
        """Per-env scores as ``results.json`` stores them (``own_per_env``)."""
        return {"success": list(self.env_success), "success_last": list(self.env_success_last)}


class EvalPoint(NamedTuple):
    """One evaluation of a task under the run's ``eval.positions`` rule.

    :param main: the run's success (held-out positions, or the training envs' under ``train`` and ``both``)
    :param heldout: the held-out positions beside it (``both`` only)
    """

    main: EvalResult
    heldout: EvalResult | None = None

    @property
    def success(self) -> float:
        return self.main.success

    def curve_values(self) -> dict[str, float | None]:
        """Curve key -> value (``success``, ``return``, ``success_last``, and ``*_heldout``)."""
        out: dict[str, float | None] = {}
        for suffix, res in (("", self.main), ("_heldout", self.heldout)):
            if res is not None:
                out.update({f"success{suffix}": res.success, f"return{suffix}": res.mean_return, f"success_last{suffix}": res.success_last})
        return out


def append_point(curve: dict[str, list], step: int, values: dict[str, float | None]) -> None:
    """Append one evaluation to ``curve`` in place, keeping every list as long as ``steps``: a key
    the curve did not have yet (a run resumed by a newer version) is padded with None first."""
    n = len(curve.setdefault("steps", []))
    for key, value in values.items():
        column = curve.setdefault(key, [])
        column.extend([None] * (n - len(column)))
        column.append(value)
    curve["steps"].append(int(step))


class EvalEnvs:
    """The evaluation envs of one task, built on first use and reseeded before every evaluation.

    Reseeding returns each env to the state its factory built it in, so every evaluation scores
    the same goals as a freshly built env would, without building (and leaking) new ones. A native
    pool (``envpool``) cannot be reseeded and is built afresh instead (about half a second).

    :param factories: eval env factories (fixed seeds)
    :param vec_type: the run's backend; ``dummy`` and ``subproc`` evaluate in-process, ``envpool``
        and ``auto`` on the pool where it serves the task (so under ``auto`` the scores do not
        depend on which backend the load made training choose)
    """

    def __init__(self, factories: list[EnvFactory], vec_type: str = "dummy", pool_threads: int = 1) -> None:
        self.factories = list(factories)
        self.vec_type = "envpool" if may_pool(vec_type) else "dummy"
        self.pool_threads = pool_threads
        self._venv: VecEnv | None = None

    def get(self, k: int) -> VecEnv:
        """The first ``k`` envs, each in the state its factory builds."""
        if isinstance(self._venv, DummyVecEnv) and self._venv.num_envs == k:
            for factory, env in zip(self.factories, self._venv.envs):
                factory.reseed(env)
            return self._venv
        self.close()
        self._venv = make_vec_env(self.factories[:k], self.vec_type, self.pool_threads)
        return self._venv

    def close(self) -> None:
        if self._venv is not None:
            self._venv.close()
            self._venv = None


def release_memory() -> None:
    """Collect garbage and hand freed heap pages back to the OS (glibc ``malloc_trim``).

    Building and closing MuJoCo envs leaves the freed memory fragmented inside glibc's heap:
    without this RSS climbed ~50 MB per MetaWorld task although nothing stayed referenced.
    """
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: nothing to trim
        pass


#: glibc's ``M_MMAP_THRESHOLD`` (``malloc.h``) and its default value, 128 KiB.
_M_MMAP_THRESHOLD, _MMAP_THRESHOLD = -3, 128 * 1024


def fix_mmap_threshold() -> None:
    """Keep glibc serving every allocation over 128 KiB with its own ``mmap``, returned to the OS on
    free.

    glibc raises that threshold each time a large block is freed, after which tensors of the
    update and the evaluation come from the heap and stay there fragmented: a CW10 run's RSS at
    task starts climbed from 933 MB (task 2) to 1,116 MB (task 7). With the threshold fixed it
    stayed within 895 MB over six tasks (docs/continual.md, "Cost"). Setting it also turns the
    adjustment off; a no-op where libc is not glibc.
    """
    try:
        ctypes.CDLL("libc.so.6").mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD)
    except (OSError, AttributeError):  # not glibc
        pass


@contextmanager
def mode_set_once(model: BaseAlgorithm) -> Iterator[None]:
    """Put the model's policy in evaluation mode once for a whole evaluation.

    SB3's ``predict`` sets the mode on every call, walking every submodule (about a fifth of a
    deterministic policy call at batch 5); here it is set once, and ``predict``'s own call is
    shadowed by a no-op for the evaluation's duration, so each step runs SB3's ``predict``
    otherwise unchanged. The policy is left in evaluation mode, as ``predict`` leaves it. A model
    without an SB3 policy (a scripted stand-in) is left as it is.
    """
    policy = getattr(model, "policy", None)
    if not isinstance(policy, BasePolicy):
        yield
        return
    policy.set_training_mode(False)
    policy.set_training_mode = _keep_mode  # type: ignore[method-assign]  (an instance attribute shadows the method)
    try:
        yield
    finally:
        del policy.set_training_mode


def _keep_mode(mode: bool) -> None:
    """:func:`mode_set_once`'s stand-in for ``set_training_mode``: the mode is already set."""


def evaluate(
    model: BaseAlgorithm, envs: EvalEnvs | list[EnvFactory], n_episodes: int, obs_rms: RunningMeanStd | None = None,
    vec_type: str = "dummy",
) -> EvalResult:
    """Run ``n_episodes`` deterministic episodes split evenly over the eval envs.

    Each env runs a fixed quota of episodes so that short (failed, early-terminated) episodes
    are not over-represented, as in SB3's ``evaluate_policy``.

    :param model: the learner (``model.predict`` is used)
    :param envs: the task's reusable :class:`EvalEnvs`, or factories (envs built and closed here)
    :param n_episodes: total episodes
    :param obs_rms: observation statistics of a ``VecNormalize`` training env, or None
    :param vec_type: the run's env backend, used when ``envs`` are factories
    """
    owned = not isinstance(envs, EvalEnvs)
    pool = EvalEnvs(envs, vec_type) if not isinstance(envs, EvalEnvs) else envs
    k = max(1, min(len(pool.factories), n_episodes))
    venv: VecEnv = pool.get(k)
    if obs_rms is not None:
        venv = VecNormalize(venv, training=False, norm_obs=True, norm_reward=False)
        venv.obs_rms = copy.deepcopy(obs_rms)
    quota = np.array([(n_episodes + i) // k for i in range(k)])  # sums to n_episodes
    done_count = np.zeros(k, dtype=int)
    successes: list[float] = []
    last: list[float] = []
    returns: list[float] = []
    env_of: list[int] = []
    try:
        obs = venv.reset()
        # As acting: the NaN guard checks the weights, and the episodes' calls share the values of
        # the weights alone (rl_moe.nn.reuse).
        with mode_set_once(model), no_distribution_checks(), weights_fixed():
            while (done_count < quota).any():
                actions, _ = model.predict(obs, deterministic=True)  # type: ignore[arg-type]
                obs, _, dones, infos = venv.step(actions)
                for i in np.flatnonzero(dones):
                    if done_count[i] < quota[i]:
                        successes.append(float(bool(infos[i].get("is_success", False))))
                        last.append(float(bool(infos[i].get("success_last", successes[-1]))))
                        returns.append(float(infos[i]["episode"]["r"]))
                        env_of.append(int(i))
                        done_count[i] += 1
    finally:
        if owned:
            pool.close()
    envs = np.asarray(env_of)
    per_env = [tuple(float(np.mean(np.asarray(v)[envs == e])) for e in range(k)) for v in (successes, last)]
    return EvalResult(float(np.mean(successes)), float(np.mean(returns)), len(successes), float(np.mean(last)), per_env[0], per_env[1])


#: TensorBoard tag group of :class:`PeriodicEval`. A task's start evaluation is logged at the global
#: step where the previous task ended, so at a boundary step these tags belong to the next task.
EVAL_TAGS = "eval/"


class PeriodicEval(BaseCallback):
    """Evaluate the current task at the task's start and then every ``every`` env steps.

    Evaluations happen at rollout boundaries (``_on_rollout_start``, i.e. right after an update),
    so each one scores freshly updated parameters: inside a PPO rollout of 16,384 steps the policy
    does not change, and evaluating there would repeat the same measurement. Logs ``eval/success``,
    ``eval/return``, ``eval/success_last`` (and their ``_heldout`` twins under ``eval.positions=both``)
    at the global step and appends the points to ``curve``.

    :param run_eval: ``() -> EvalPoint`` (or a bare :class:`EvalResult`) for the current policy
    :param every: env steps between evaluations
    :param task_end: global step at which the task's segment ends (no periodic eval there: the
        scheduler's end-of-task evaluation takes that point)
    :param curve: dict of lists (``steps``, ``success``, ``return``, ...), appended in place
    :param log_start: write the task-start evaluation to TensorBoard; False on the first task
        after a resume, whose start step the interrupted run already logged (the value is the same)
    """

    def __init__(
        self, run_eval: Callable[[], EvalPoint | EvalResult], every: int, task_end: int, curve: dict[str, list], log_start: bool = True
    ) -> None:
        super().__init__()
        self.run_eval, self.every, self.task_end, self.curve = run_eval, max(1, every), task_end, curve
        self.log_start = log_start
        self.next_eval = 0
        self.resumed_next: int | None = None

    def _record(self, log: bool = True) -> None:
        res = self.run_eval()
        values = (res if isinstance(res, EvalPoint) else EvalPoint(res)).curve_values()
        append_point(self.curve, self.num_timesteps, values)
        if log:
            keys = [f"{EVAL_TAGS}{k}" for k, v in values.items() if v is not None]
            for key in keys:
                self.logger.record(key, values[key[len(EVAL_TAGS):]])
            dump_keys(self.logger, tuple(keys), self.num_timesteps)

    def _on_training_start(self) -> None:
        if self.resumed_next is not None:  # inside the task: its start and due points are behind
            self.next_eval = self.resumed_next
            return
        self._record(self.log_start)
        self.next_eval = self.num_timesteps + self.every

    def state(self) -> dict[str, int]:
        """The schedule an in-task checkpoint keeps (:mod:`rl_moe.continual.intask`)."""
        return {"next_eval": int(self.next_eval)}

    def resume(self, state: dict[str, int]) -> None:
        """Continue the schedule of :meth:`state` instead of starting the task's."""
        self.resumed_next = int(state["next_eval"])

    def _on_rollout_start(self) -> None:
        self.num_timesteps = self.model.num_timesteps  # SB3 updates it only in on_step
        if self.next_eval <= self.num_timesteps < self.task_end:
            self._record()
            # Skip the due points a long rollout jumped over: one evaluation per boundary.
            missed = (self.num_timesteps - self.next_eval) // self.every
            self.next_eval += (missed + 1) * self.every

    def _on_step(self) -> bool:
        return True

"""Env families, one :class:`EnvFamily` each in :data:`FAMILIES`: how a family's tasks are built,
checked and reseeded, whether it is installed, and its scripted experts.

A suite names its family; nothing else in the package branches on a family's name (what only
MetaWorld scenes allow asks :attr:`EnvFamily.metaworld_scenes`, the fast path's record
:attr:`EnvFamily.fast_path`). Adding one
is an entry here (or a module of its own calling :func:`register_family`) plus a suite file
(docs/contributing.md, "Adding a task family").
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import gymnasium as gym

from rl_moe.cli import reraise_interrupt
from rl_moe.envs.envpool_env import ENVPOOL_MISMATCHED, ENVPOOL_VERIFIED, EnvPoolMetaWorld, official_observation_space
from rl_moe.envs.suite_spec import Suite, TaskSpec
from rl_moe.envs.wrappers import PermuteObsFlipAction
from rl_moe.errors import MissingDependencyError, UsageError

#: A scripted policy: ``get_action(obs) -> action`` (MetaWorld's policy classes have this shape).
Expert = Any


def _reseed_by_reset(env: gym.Env, seed: int) -> None:
    env.reset(seed=seed)
    env.action_space.seed(seed)


def _nothing_to_check(suite: Suite) -> None:
    return None


def _always_available() -> None:
    return None


@dataclass(frozen=True)
class EnvFamily:
    """One env family.

    :param name: the suite's ``family`` value
    :param make: ``(task, seed) -> gym.Env``, the raw env (the factory adds time limit, success
        wrapper and ``Monitor``); must be a module-level function (SubprocVecEnv pickles it)
    :param reseed: ``(env, seed) -> None``: puts a built env back into the state ``make`` left it
        in, so evaluation envs are built once per task and reused
    :param check_tasks: raises :class:`UsageError` for a task of the suite the family cannot build
        (checked before any run folder exists)
    :param check_available: raises :class:`MissingDependencyError` with the install command when
        the family's package is missing
    :param expert: ``task name -> scripted policy`` for ``probe.policy=expert``, raising
        ValueError for a task without one; None where the family has no experts
    :param pool: ``(task, seeds, episode_length, threads) -> VecEnv | str``, a native vectorized
        backend (``--vec-env envpool``) with the same protocol as the factories, returning instead
        a one-line reason for a task it does not serve faithfully (the official envs then serve
        it); None where the family has no native backend
    :param pool_refusal: ``task -> reason | None``: the reason ``pool`` would give, without
        building anything (so a run can name its fallbacks once, at its start)
    :param stage_keys: numeric ``info`` keys logged at episode ends as ``rollout/final_<key>``
        (:mod:`rl_moe.envs.stages`): the stages a task's reward is built from
    :param task_fields: the fields a suite's task may carry besides ``name`` and ``success_bar``
        (they reach ``make`` as ``task.params``); any other field is refused with exit code 2
    :param metaworld_scenes: its envs are MetaWorld v3 Sawyer scenes, so TensorBoard clips and
        videos can render them
    :param fast_path: ``make`` puts MetaWorld's fast path under its envs where it applies
        (:func:`rl_moe.envs.metaworld_fast.make_fast`). Envs in worker processes are recorded as
        ``subproc+fast`` by this flag, since the learner's process cannot inspect them (in-process
        envs are inspected)
    """

    name: str
    make: Callable[[TaskSpec, int], gym.Env]
    reseed: Callable[[gym.Env, int], None] = _reseed_by_reset
    check_tasks: Callable[[Suite], None] = _nothing_to_check
    check_available: Callable[[], None] = _always_available
    expert: Callable[[str], Expert] | None = None
    pool: Callable[[TaskSpec, list[int], int, int], Any] | None = None
    pool_refusal: Callable[[TaskSpec], str | None] | None = None
    stage_keys: tuple[str, ...] = ()
    task_fields: tuple[str, ...] = ()
    metaworld_scenes: bool = False
    fast_path: bool = False


# ---- MetaWorld ---------------------------------------------------------------------------------
#: MetaWorld's reward functions, picked per task by the suite field ``reward_version``. "v2" is
#: metaworld 3.x's default; "v1" is the earlier formulation that every v3 env keeps as an option
#: (``reward_function_version``), closer to the v1 tasks Continual World was defined on.
METAWORLD_REWARD_VERSIONS: tuple[str, ...] = ("v2", "v1")
#: MetaWorld's position rules, picked per task by the suite field ``position_rule`` (``positions``
#: in files written before 2026-11-26, still read): "resample" draws
#: a fresh object and goal position at every reset from the env's seeded generator (Continual
#: World's rule); "fixed" keeps the position each env drew at construction from its seed, as
#: MetaWorld's goal-observable classes do (the SPHERE authors' code trains on those).
METAWORLD_POSITIONS: tuple[str, ...] = ("resample", "fixed")
#: MetaWorld task fields a suite file may set besides ``name`` (``task_defaults`` sets them for
#: every task of the suite).
METAWORLD_TASK_FIELDS: tuple[str, ...] = ("reward_version", "position_rule")


def metaworld_reward_version(task: TaskSpec) -> str:
    """The reward function ``task`` trains on (``reward_version``, default "v2")."""
    return str(task.params.get("reward_version", METAWORLD_REWARD_VERSIONS[0]))


def metaworld_positions(task: TaskSpec) -> str:
    """The position rule of ``task`` (``position_rule``, default "resample")."""
    return str(task.params.get("position_rule", METAWORLD_POSITIONS[0]))


#: Environment variable that turns the MetaWorld fast path off ("0"); read where each env is built,
#: so worker processes inherit it. On by default: it is bit-identical (rl_moe.envs.metaworld_fast).
METAWORLD_FAST_VAR = "RL_MOE_METAWORLD_FAST"


def metaworld_fast_enabled() -> bool:
    """Whether MetaWorld envs are built on the fast path (:data:`METAWORLD_FAST_VAR` not "0")."""
    return os.environ.get(METAWORLD_FAST_VAR, "1") != "0"


def _make_metaworld(task: TaskSpec, seed: int) -> gym.Env:
    import metaworld  # noqa: F401  (registers the Meta-World/* ids)

    # MT1 pre-samples 50 goals and ignores reset(seed=). The goal-observable class draws its
    # position from ``seed`` at construction and freezes it ("fixed"); unfrozen, with a seeded
    # rand vec, it draws a fresh one at every reset, as Continual World does ("resample").
    env = gym.make("Meta-World/goal_observable", env_name=task.name, seed=seed, disable_env_checker=True)
    if metaworld_positions(task) == "resample":
        env.unwrapped._freeze_rand_vec = False  # type: ignore[attr-defined]
        env.unwrapped.seeded_rand_vec = True  # type: ignore[attr-defined]
    # compute_reward reads the attribute at every step, so setting it after construction is enough.
    env.unwrapped.reward_function_version = metaworld_reward_version(task)  # type: ignore[attr-defined]
    if not metaworld_fast_enabled():
        return env
    from rl_moe.envs.metaworld_fast import make_fast  # lazy: loads mujoco; only MetaWorld runs need it

    return make_fast(env)


def _reseed_metaworld(env: gym.Env, seed: int) -> None:
    env.unwrapped.seed(seed)  # type: ignore[attr-defined]  (reset(seed=) is ignored)


def metaworld_names() -> tuple[str, ...]:
    """Every MetaWorld v3 task name."""
    from metaworld.env_dict import ALL_V3_ENVIRONMENTS_GOAL_OBSERVABLE  # lazy: loads mujoco; only MetaWorld runs need it

    return tuple(sorted(k.replace("-goal-observable", "") for k in ALL_V3_ENVIRONMENTS_GOAL_OBSERVABLE))


def _check_metaworld_tasks(suite: Suite) -> None:
    valid = metaworld_names()
    for t in (*suite.tasks, *suite.probe_tasks):
        if t.name not in valid:
            raise UsageError(f"unknown MetaWorld task {t.name!r} in suite {suite.name!r}; valid choices: {', '.join(valid)}")
        if metaworld_reward_version(t) not in METAWORLD_REWARD_VERSIONS:
            raise UsageError(
                f"unknown reward_version {t.params['reward_version']!r} of MetaWorld task {t.name!r}; "
                f"valid choices: {', '.join(METAWORLD_REWARD_VERSIONS)}"
            )
        if metaworld_positions(t) not in METAWORLD_POSITIONS:
            raise UsageError(
                f"unknown position_rule {t.params['position_rule']!r} of MetaWorld task {t.name!r}; "
                f"valid choices: {', '.join(METAWORLD_POSITIONS)}"
            )


def _check_metaworld_available() -> None:
    if importlib.util.find_spec("metaworld") is None:
        raise MissingDependencyError("MetaWorld is not installed; install it with: pip install 'metaworld==3.1.1' packaging")


#: MetaWorld tasks whose scripted policy does not follow the naming rule of :func:`metaworld_expert`.
_EXPERT_CLASS_NAMES: dict[str, str] = {"peg-insert-side-v3": "SawyerPegInsertionSideV3Policy"}


def metaworld_expert(task: str) -> Expert:
    """MetaWorld's scripted policy of ``task`` (``reach-v3`` -> ``SawyerReachV3Policy``).

    :raises ValueError: if metaworld has no scripted policy under that name
    """
    import metaworld.policies as policies  # lazy: loads mujoco; only MetaWorld runs need it

    *words, version = task.split("-")
    name = _EXPERT_CLASS_NAMES.get(task, "Sawyer" + "".join(w.capitalize() for w in words) + version.upper() + "Policy")
    cls = getattr(policies, name, None)  # metaworld names its scripted policies after the task
    if cls is None:
        raise ValueError(f"metaworld has no scripted policy {name!r} for probe task {task!r}; use probe.policy=random")
    return cls()


def _metaworld_pool_refusal(task: TaskSpec) -> str | None:
    """Why EnvPool does not serve ``task`` faithfully (the official envs run it), or None. The
    suite's rules come first: where they rule EnvPool out, every task of the suite shares the reason."""
    if metaworld_positions(task) != METAWORLD_POSITIONS[0]:
        return f"the suite keeps each task's object and goal positions {metaworld_positions(task)}, and EnvPool's MetaWorld draws new ones at every reset"
    version = metaworld_reward_version(task)
    if version != METAWORLD_REWARD_VERSIONS[0]:
        return f"EnvPool computes MetaWorld's default reward only, not reward_version {version!r}"
    if task.name in ENVPOOL_MISMATCHED:
        return f"EnvPool's version of the task behaves differently ({ENVPOOL_MISMATCHED[task.name]})"
    if task.name not in ENVPOOL_VERIFIED:
        return "it has not been checked against the official env (rl_moe.envs.backend_check)"
    return None


def _metaworld_pool(task: TaskSpec, seeds: list[int], episode_length: int, threads: int) -> Any:
    """EnvPool's native MetaWorld v3 envs for ``task``, or why the official envs serve it."""
    refusal = _metaworld_pool_refusal(task)
    if refusal is not None:
        return refusal
    return EnvPoolMetaWorld(task.name, seeds, episode_length, threads, official_observation_space())


# ---- HumanoidBench -----------------------------------------------------------------------------
def _make_humanoidbench(task: TaskSpec, seed: int) -> gym.Env:
    from rl_moe.envs.humanoidbench import make_h1  # lazy: imports the optional HumanoidBench stack

    env = make_h1(task.name)
    env.reset(seed=seed)
    return env


def _check_humanoidbench_available() -> None:
    from rl_moe.envs.humanoidbench import check_available  # lazy: imports the optional HumanoidBench stack

    check_available()


# ---- smoke: Pendulum with permuted observations and flipped actions ------------------------------
#: Smoke task fields besides ``name`` and ``success_bar``.
SMOKE_TASK_FIELDS: tuple[str, ...] = ("env_id", "permutation", "action_sign")


def _make_smoke(task: TaskSpec, seed: int) -> gym.Env:
    env = gym.make(str(task.params.get("env_id", "Pendulum-v1")), disable_env_checker=True)
    env = PermuteObsFlipAction(env, task.params.get("permutation", (0, 1, 2)), float(task.params.get("action_sign", 1.0)))
    env.reset(seed=seed)
    env.action_space.seed(seed)
    return env


def _check_smoke_tasks(suite: Suite) -> None:
    for t in (*suite.tasks, *suite.probe_tasks):
        env_id = str(t.params.get("env_id", "Pendulum-v1"))
        if env_id not in gym.registry:
            raise UsageError(f"unknown gymnasium env id {env_id!r} for task {t.name!r}; e.g. Pendulum-v1")
        try:
            _make_smoke(t, 0).close()
        except ValueError as exc:
            raise UsageError(f"bad smoke task {t.name!r}: {exc}") from None


#: ``family`` name -> spec (the learners' settings per family are in :mod:`rl_moe.continual.presets`).
FAMILIES: dict[str, EnvFamily] = {
    "metaworld": EnvFamily(
        name="metaworld", make=_make_metaworld, reseed=_reseed_metaworld, check_tasks=_check_metaworld_tasks,
        check_available=_check_metaworld_available, expert=metaworld_expert, pool=_metaworld_pool, pool_refusal=_metaworld_pool_refusal,
        stage_keys=("near_object", "grasp_success", "grasp_reward", "in_place_reward", "obj_to_target"),
        task_fields=METAWORLD_TASK_FIELDS, metaworld_scenes=True, fast_path=True,
    ),
    "humanoidbench": EnvFamily(
        name="humanoidbench", make=_make_humanoidbench, check_available=_check_humanoidbench_available,
    ),
    "smoke": EnvFamily(
        name="smoke", make=_make_smoke, check_tasks=_check_smoke_tasks, task_fields=SMOKE_TASK_FIELDS,
    ),
}  # fmt: skip


def register_family(family: EnvFamily) -> EnvFamily:
    """Add ``family`` to :data:`FAMILIES` (a family module outside the package calls this when it
    is imported; a suite names that module in ``family_module``)."""
    FAMILIES[family.name] = family
    return family


def load_family_module(module: str) -> None:
    """Import a suite's ``family_module`` (it registers its family); :class:`UsageError` if it
    cannot be imported."""
    try:
        importlib.import_module(module)
    except ImportError as exc:
        reraise_interrupt(exc)
        raise UsageError(f"cannot import family module {module!r} ({exc}); it must be importable, e.g. on PYTHONPATH") from None


def get_family(name: str, module: str = "") -> EnvFamily:
    """The spec of family ``name``, importing ``module`` first when the family is not registered
    yet (a worker process of a user's family); :class:`UsageError` names the valid choices."""
    if name not in FAMILIES and module:
        load_family_module(module)
    if name not in FAMILIES:
        raise UsageError(f"unknown env family {name!r}; valid choices: {', '.join(FAMILIES)}")
    return FAMILIES[name]

"""Turning CLI choices into a validated :class:`RunConfig`: every check happens here, before any
file is written, so a user mistake never leaves a half-made run folder."""

from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from rl_moe.continual.agents import net_configs_for
from rl_moe.continual.config import (
    EVAL_POSITIONS, EvalSettings, NetSettings, RunConfig, apply_overrides, preset_overrides, protocol_rules, regularizer_configs,
)  # fmt: skip
from rl_moe.continual.intask import CheckpointSettings
from rl_moe.continual.learners import LEARNERS, AlgoSpec, check_fast_update, get_learner
from rl_moe.continual.methods import METHODS, Method, get_method
from rl_moe.continual.networks import LAMBDA_ARITHMETICS, NETWORKS, suite_network
from rl_moe.continual.presets import learner_presets
from rl_moe.continual.probe_states import PROBE_POLICIES, default_probe_policy
from rl_moe.continual.values import with_settings
from rl_moe.diagnostics.probe import ProbeConfig
from rl_moe.envs.factories import resolve_vec_env_type
from rl_moe.envs.families import get_family
from rl_moe.envs.suites import Suite, load_suite
from rl_moe.errors import UsageError, check_choice, check_keys, check_positive
from rl_moe.provenance import code_version
from rl_moe.regularizers import REGISTRY
from rl_moe.rundir import RunDir

#: The preset of a learner when the suite names none.
DEFAULT_PRESET = "metaworld"
PROTOCOLS: tuple[str, ...] = ("crl", "rl")
#: Env seeds are seed * 100_000 + offsets below 100_000 (rng.env_seed); numpy takes < 2**32.
MAX_SEED = (2**32 - 1) // 100_000 - 1
#: 10x HumanoidBench's 10M steps: anything larger is a typo, not a run (a 1e12-step task ran for an ETA of 97 years).
MAX_STEPS_PER_TASK = 100_000_000
DEVICES: tuple[str, ...] = ("auto", "cpu", "cuda")


@dataclass(frozen=True)
class RunRequest:
    """The user's choices, as parsed by the CLI (None = the suite's default).

    :param preset: named override bundle (:data:`OVERRIDE_PRESETS`), applied before ``overrides``
    :param overrides: ``--set`` strings, applied after the presets
    """

    suite: str = "smoke"
    algo: str = "ppo"
    method: str = "sphere"
    protocol: str = "crl"
    seed: int = 0
    steps_per_task: int | None = None
    tasks: int | None = None
    device: str = "auto"
    vec_env: str = "auto"
    n_experts: int | None = None
    top_k: int | None = None
    reference: str | None = None
    preset: str | None = None
    overrides: tuple[str, ...] = field(default_factory=tuple)


def check_sections(sections: dict[str, Any]) -> None:
    """Range-check the numeric settings (new runs and ``--set`` on a resume alike); ``probe``
    checks its own ranges when built."""
    for spec in LEARNERS.values():
        spec.check(sections[spec.name])
    check_positive("eval", sections["eval"], ("evals_per_task", "n_episodes", "matrix_episodes", "n_envs"))
    check_choice(sections["eval"].positions, EVAL_POSITIONS, "eval.positions")
    check_positive("checkpoint", sections["checkpoint"], (), ("every_steps", "every_minutes"))
    check_positive("net", sections["net"], ("temperature",))
    for spec in LEARNERS.values():
        check_fast_update(spec, sections[spec.name])


def _resolve_probe_policy(probe: ProbeConfig, suite: Suite) -> ProbeConfig:
    """``auto`` -> the family's default; ``expert`` must exist for the probe task."""

    policy = check_choice(probe.policy, ("auto", *PROBE_POLICIES), "probe.policy")
    if policy == "auto":
        policy = default_probe_policy(suite.family)
    if policy == "expert":
        make_expert = get_family(suite.family, suite.family_module).expert
        if make_expert is None:
            raise UsageError(f"probe.policy 'expert' needs scripted experts, which family {suite.family!r} lacks; valid choices here: auto, random")
        for task in suite.probe_tasks:
            try:
                make_expert(task.name)
            except ValueError as exc:
                raise UsageError(str(exc)) from None
    return dataclasses.replace(probe, policy=policy)


def _check_net(cfg: RunConfig) -> None:
    method = get_method(cfg.method)
    kind = method.kind
    if method.bounded_mean and cfg.algo != "ppo":
        raise UsageError(f"method {method.name!r} bounds PPO's Gaussian mean and --algo {cfg.algo} has none (TD3's actor is tanh-bounded already); valid choices: --algo ppo")
    if cfg.net.kind != kind:
        raise UsageError(f"--set net.kind={cfg.net.kind}: the network kind is the method's ({kind!r}); pick it with --method")
    try:
        net_configs_for(cfg, obs_dim=4, act_dim=2)  # dims do not affect validity
    except ValueError as exc:
        raise UsageError(f"bad network settings: {exc}") from None


def _check_clip(evals: EvalSettings, suite: Suite) -> None:
    """``eval.clip_*``: in range, on a MetaWorld suite, with a headless OpenGL to render it."""
    if evals.clip_steps < 0 or evals.clip_stride < 1:
        raise UsageError(f"eval.clip_steps must be >= 0 and eval.clip_stride >= 1, got {evals.clip_steps} and {evals.clip_stride}")
    if len(evals.clip_size) != 2 or min(evals.clip_size) < 1:
        raise UsageError(f"eval.clip_size must be WIDTH,HEIGHT of positive pixels, got {','.join(map(str, evals.clip_size))}")
    if evals.clip_steps == 0:
        return
    if not get_family(suite.family, suite.family_module).metaworld_scenes:
        raise UsageError(f"eval.clip_steps renders MetaWorld scenes; suite {suite.name!r} is {suite.family!r}: set eval.clip_steps=0")
    from rl_moe.recording import choose_backend  # lazy: the recording module is needed only here

    choose_backend()


def _check_device(device: str) -> None:
    check_choice(device, DEVICES, "device")
    if device == "cuda":
        if not torch.cuda.is_available():
            raise UsageError("device 'cuda' requested but no CUDA GPU is available; valid choices here: auto, cpu")


def _check_named_pool(vec_env: str, suite: Suite, tasks: tuple[str, ...]) -> None:
    """``--vec-env envpool`` named by the user on a run none of whose tasks the pool can serve
    faithfully (the paper's fixed positions rule it out on every MetaWorld task) is refused, not
    replaced by the official envs; ``auto`` chooses per task, and a run the pool serves in part
    keeps its per-task notes."""
    refusal = get_family(suite.family, suite.family_module).pool_refusal if vec_env == "envpool" else None
    if refusal is None:
        return
    why = [refusal(t) for t in suite.tasks if t.name in tasks]
    if all(w is not None for w in why):
        raise UsageError(f"--vec-env envpool cannot run suite {suite.name!r}: {why[0]}; valid choices here: auto, dummy, subproc")


def check_reference(path: str | None) -> None:
    """A forward-transfer reference must be a run folder with a readable results.json."""
    if path is None:
        return
    results = RunDir(path).results
    if not results.is_file():
        raise UsageError(f"--reference {path!r} is not a run folder (no {results.name})")
    try:
        json.loads(results.read_text())
    except json.JSONDecodeError:
        raise UsageError(f"--reference {path!r}: {results.name} is not valid JSON") from None


def check_suite_settings(suite: Suite) -> None:
    """The names of a suite's ``net`` and ``eval`` defaults (values are parsed with ``--set``'s).

    Checked here rather than by the suite loader: the settings' types belong to the run config,
    which the env package does not import.
    """
    where = f" in suite {suite.source or suite.name}"
    # The method picks the network kind; a suite choosing it would silently override --method.
    for section, given, cls, skip in (("net", suite.net, NetSettings, ("kind",)), ("eval", suite.eval, EvalSettings, ())):
        check_keys(given, [f.name for f in dataclasses.fields(cls) if f.name not in skip], f"{section} setting", where)
    check_keys(suite.presets, LEARNERS, "learner", f" in the presets{where}")
    if suite.network:
        check_choice(suite.network, tuple(NETWORKS), f"network{where}")
    check_keys(suite.regularizers, REGISTRY, "regularizer", f" in the regularizers{where}")


def first_tasks(suite: Suite, n: int | None) -> tuple[str, ...]:
    """The names of the suite's first ``n`` tasks (all of them for None).

    :raises UsageError: ``n`` outside 1..the suite's task count
    """
    if n is not None and not 1 <= n <= len(suite.tasks):
        raise UsageError(f"--tasks must be in 1..{len(suite.tasks)} for suite {suite.name!r}, got {n}")
    return suite.task_names[:n]


def suite_preset(suite: Suite, algo: str) -> Any:
    """The settings section a suite names for a learner (:data:`DEFAULT_PRESET` where it names
    none or, for a learner other than the run's, one that learner lacks)."""
    choices = learner_presets(algo)
    return choices.get(suite.presets.get(algo, DEFAULT_PRESET), choices[DEFAULT_PRESET])


def resolve(req: RunRequest) -> RunConfig:
    """Validate ``req`` completely and return the resolved, frozen run configuration."""
    suite = load_suite(req.suite)
    check_suite_settings(suite)
    spec = get_learner(req.algo)
    algo = spec.name
    protocol = check_choice(req.protocol, PROTOCOLS, "protocol")
    method = get_method(req.method)
    tasks = first_tasks(suite, req.tasks)
    steps = suite.steps_per_task if req.steps_per_task is None else req.steps_per_task
    if not 0 < steps <= MAX_STEPS_PER_TASK:
        raise UsageError(f"--steps-per-task must be in 1..{MAX_STEPS_PER_TASK:,}, got {steps:,}")
    if not 0 <= req.seed <= MAX_SEED:
        raise UsageError(f"--seed must be in 0..{MAX_SEED} (per-task env seeds are derived from it and must stay below 2**32), got {req.seed}")
    _check_device(req.device)
    _check_named_pool(req.vec_env, suite, tasks)

    sections, regs = _sections(req, suite, spec, method)
    n_envs = sections[algo].n_envs
    cfg = RunConfig(
        suite=req.suite,
        suite_data=suite.to_dict(),
        tasks=tasks,
        algo=algo,
        method=method.name,
        protocol=protocol,
        seed=req.seed,
        steps_per_task=steps,
        device=req.device,
        vec_env=resolve_vec_env_type(req.vec_env, n_envs, family=suite.family),
        regularizers=regs,
        reference=None if req.reference is None else str(Path(req.reference).resolve()),
        preset=req.preset,
        created=time.strftime("%Y%m%d-%H%M%S", time.gmtime()),
        code=code_version(),
        **sections,
    )
    # The loaded Suite travels with the config (RunConfig.suite_spec): only a config read back
    # from config.json rebuilds it from the stored dict.
    cfg.__dict__["suite_spec"] = suite
    _check_net(cfg)
    _check_clip(cfg.eval, suite)
    family = get_family(suite.family, suite.family_module)
    family.check_available()
    family.check_tasks(suite)
    check_reference(req.reference)
    return cfg


def _sections(req: RunRequest, suite: Suite, spec: AlgoSpec, method: Method) -> tuple[dict[str, Any], dict[str, Any]]:
    """The run's settings sections and its method's regularizer configs: defaults, the suite's,
    the method's, then the ``--preset`` bundle, ``--experts``/``--top-k`` and ``--set`` (later wins)."""
    flags = [f"net.{k}={v}" for k, v in (("n_experts", req.n_experts), ("top_k", req.top_k)) if v is not None]
    presets = learner_presets(spec.name)
    preset = suite.presets.get(spec.name, DEFAULT_PRESET)
    if preset not in presets:
        raise UsageError(f"suite {suite.name!r} names unknown {spec.name} preset {preset!r}; valid choices: {', '.join(presets)}")
    # The suite's named network, then its network and eval defaults go in as typed values; the
    # --preset bundle, --experts/--top-k and --set come after them (later wins).
    named = NETWORKS[suite_network(suite.network, method.kind)].settings
    net = with_settings(with_settings(NetSettings(kind=method.kind), named, "net"), suite.net, "net")
    evals = with_settings(EvalSettings(), suite.eval, "eval")
    sections: dict[str, Any] = {"net": net, "eval": evals, "probe": ProbeConfig(), "checkpoint": CheckpointSettings()}
    for other in LEARNERS.values():  # every learner's section is stored; the run's is used
        sections[other.name] = suite_preset(suite, other.name)
    # Every regularizer the suite sets is checked (a typo there is caught whatever the method);
    # the run keeps the method's.
    checked = regularizer_configs(dict.fromkeys([*method.regularizers, *suite.regularizers]), _regularizer_settings(suite, spec, method))
    regs = {name: checked[name] for name in method.regularizers}
    bundle: tuple[str, ...] = ()
    if req.preset is not None:
        bundle = preset_overrides(req.preset, method.regularizers)
    overrides = [*bundle, *flags, *req.overrides]
    sections, regs = apply_overrides(sections, regs, overrides, used=method.regularizers)
    check_sections(sections)
    sections["probe"] = _resolve_probe_policy(sections["probe"], suite)
    if sections["net"].critic_moe is None:  # store the algo default explicitly in config.json
        sections["net"] = dataclasses.replace(sections["net"], critic_moe=spec.critic_moe)
    return sections, regs


def _regularizer_settings(suite: Suite, spec: AlgoSpec, method: Method) -> dict[str, dict[str, Any]]:
    """Regularizer keyword settings before ``--set``: the learner's defaults, then the suite's,
    then what makes the method itself (later wins)."""
    settings = {k: dict(v) for k, v in spec.regularizer_defaults.items()}
    for name, kwargs in suite.regularizers.items():
        settings[name] = {**settings.get(name, {}), **kwargs}
    for name, kwargs in method.settings.items():
        settings[name] = {**settings.get(name, {}), **kwargs}
    return settings


def moved_settings(cfg: RunConfig) -> dict[str, Any]:
    """The method's regularizer settings this run moved away from the method's own (``--set
    reg.<name>.<field>``), as ``{"<name>.<field>": value}``: a run of ``--method sphere --set
    reg.sphere.rho=0.001`` is another method than ``--method sphere``, and the report says so.
    Measured against today's method definitions, so a run made before a default changed shows
    the setting it ran with."""
    method = METHODS.get(cfg.method)
    if method is None:
        return {}
    own = regularizer_configs(method.regularizers, _regularizer_settings(suite_of(cfg), get_learner(cfg.algo), method))
    moved = {}
    for name in cfg.regularizers.keys() & own.keys():
        theirs = dataclasses.asdict(own[name])
        labelled = LABELLED_FIELDS.get(name, ())
        moved.update({f"{name}.{k}": v for k, v in dataclasses.asdict(cfg.regularizers[name]).items() if theirs[k] != v and k not in labelled})
    return moved


#: Regularizer fields a run's ``config.json`` names by a label of their own
#: (:meth:`RunConfig.labels`: SPHERE's lambda arithmetic), so :func:`moved_settings` leaves them out.
LABELLED_FIELDS: dict[str, tuple[str, ...]] = {"sphere": tuple(LAMBDA_ARITHMETICS["authors"])}


def suite_of(cfg: RunConfig) -> Suite:
    """The suite stored in a run's configuration (typed once per config)."""
    return cfg.suite_spec


#: The protocol rules a ``--set`` can move away from its suite's, and their names in run folders
#: (the suite's own rules are named by the suite, whose name is the folder above the run).
RULE_TAGS: dict[str, str] = {"grad_clip": "clip", "eval_positions": "eval"}


def suite_rules(suite: Suite, algo: str) -> dict[str, Any]:
    """The rules a run of ``suite`` with ``algo`` holds under with no ``--set``: the suite's
    episode length and shared task fields, its learner preset's clipping and its evaluation
    defaults (what :meth:`RunConfig.rules` reports for an unchanged run)."""
    positions = dict(suite.eval).get("positions", EvalSettings().positions)
    return protocol_rules(suite.episode_length, [t.to_dict() for t in suite.tasks], suite_preset(suite, algo), positions)


def rules_tag(cfg: RunConfig) -> str:
    """``""`` for a run under its suite's rules, else its overridden rules as ``-clip-joint``,
    ``-eval-train`` ...: a run that changes the protocol says so in its folder's name, so that
    two runs of one suite under different rules never share a folder or a name in a table."""
    ours, theirs = cfg.rules(), suite_rules(suite_of(cfg), cfg.algo)
    return "".join(f"-{tag}-{ours[key]}" for key, tag in RULE_TAGS.items() if ours[key] != theirs[key])

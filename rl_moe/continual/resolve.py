"""Turning CLI choices into a validated :class:`RunConfig`: every check happens here, before any
file is written, so a user mistake never leaves a half-made run folder."""

from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rl_moe.algos.fast import FAST_MODES
from rl_moe.continual.config import OVERRIDE_PRESETS, EvalSettings, NetSettings, ProbeSettings, RunConfig, apply_overrides
from rl_moe.continual.envs import check_family_available, check_tasks, resolve_vec_env_type
from rl_moe.continual.errors import UsageError
from rl_moe.continual.methods import check_regularizers, get_method
from rl_moe.continual.presets import PPO_PRESETS, TD3_PRESETS
from rl_moe.continual.suites import Suite, load_suite, suite_from_dict

ALGO_NAMES: tuple[str, ...] = ("ppo", "td3")
PROTOCOLS: tuple[str, ...] = ("crl", "rl")
DEVICES: tuple[str, ...] = ("auto", "cpu", "cuda")
#: Algo-specific regularizer defaults, beneath the suite's and the user's settings: under TD3
#: SPHERE regularizes the MoE critics (SPHERE Table 22), and the DSC losses cover the critics' DSC
#: layers as well as the actor's.
ALGO_REGULARIZER_DEFAULTS: dict[str, dict[str, dict[str, Any]]] = {"td3": {"sphere": {"placement": "critic"}, "dsc": {"target": "both"}}}


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


def _choice(value: str, valid: tuple[str, ...], what: str) -> str:
    if value not in valid:
        raise UsageError(f"unknown {what} {value!r}; valid choices: {', '.join(valid)}")
    return value


def _positive(section: str, obj: Any, names: tuple[str, ...], allow_zero: tuple[str, ...] = ()) -> None:
    """``names`` must be > 0 and ``allow_zero`` >= 0."""
    for name in (*names, *allow_zero):
        value = getattr(obj, name)
        low_ok = value >= 0 if name in allow_zero else value > 0
        if not low_ok:
            bound = ">= 0" if name in allow_zero else "> 0"
            raise UsageError(f"{section}.{name} must be {bound}, got {value}")


def _within(section: str, obj: Any, names: tuple[str, ...], low: float, high: float, low_open: bool) -> None:
    """``names`` must lie in (low, high] (``low_open``) or [low, high]."""
    for name in names:
        value = getattr(obj, name)
        if not ((low < value) if low_open else (low <= value)) or value > high:
            raise UsageError(f"{section}.{name} must be in {'(' if low_open else '['}{low:g}, {high:g}], got {value}")


def check_sections(sections: dict[str, Any]) -> None:
    """Range-check the numeric settings (new runs and ``--set`` on a resume alike)."""
    _positive("ppo", sections["ppo"], ("n_envs", "n_steps", "batch_size", "n_epochs", "lr_start", "lr_decay_fraction", "clip_range", "max_grad_norm"), ("lr_end", "ent_coef", "vf_coef"))
    _within("ppo", sections["ppo"], ("gamma", "lr_decay_fraction"), 0.0, 1.0, True)
    _within("ppo", sections["ppo"], ("gae_lambda",), 0.0, 1.0, False)
    _positive("td3", sections["td3"], ("n_envs", "buffer_size", "batch_size", "train_freq", "gradient_steps", "policy_delay", "lr"), ("learning_starts", "action_noise_std", "target_policy_noise", "target_noise_clip"))
    _within("td3", sections["td3"], ("gamma", "tau"), 0.0, 1.0, True)
    _positive("eval", sections["eval"], ("evals_per_task", "n_episodes", "matrix_episodes", "n_envs"))
    _positive("probe", sections["probe"], ("n_states",), ("every", "noise"))
    _positive("net", sections["net"], ("temperature",))
    for algo_name in ("ppo", "td3"):
        _choice(sections[algo_name].fast_update, FAST_MODES, f"{algo_name}.fast_update")


def _resolve_probe_policy(probe: ProbeSettings, suite: Suite) -> ProbeSettings:
    """``auto`` -> the family's default; ``expert`` must exist for the probe task."""
    from rl_moe.continual.probe import EXPERT_FAMILIES, PROBE_POLICIES, default_probe_policy, metaworld_expert

    policy = _choice(probe.policy, ("auto", *PROBE_POLICIES), "probe.policy")
    if policy == "auto":
        policy = default_probe_policy(suite.family)
    if policy == "expert":
        if suite.family not in EXPERT_FAMILIES:
            raise UsageError(f"probe.policy 'expert' needs scripted experts, which family {suite.family!r} lacks; valid choices here: auto, random")
        try:
            metaworld_expert(suite.probe_task.name)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    return dataclasses.replace(probe, policy=policy)


def _check_net(cfg: RunConfig) -> None:
    from rl_moe.continual.agents import net_configs_for

    try:
        net_configs_for(cfg, obs_dim=4, act_dim=2)  # dims do not affect validity
    except ValueError as exc:
        raise UsageError(f"bad network settings: {exc}") from None


def _check_device(device: str) -> None:
    _choice(device, DEVICES, "device")
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise UsageError("device 'cuda' requested but no CUDA GPU is available; valid choices here: auto, cpu")


def _check_reference(path: str | None) -> None:
    if path is None:
        return
    results = Path(path) / "results.json"
    if not results.is_file():
        raise UsageError(f"--reference {path!r} is not a run folder (no results.json)")
    try:
        json.loads(results.read_text())
    except json.JSONDecodeError:
        raise UsageError(f"--reference {path!r}: results.json is not valid JSON") from None


def resolve(req: RunRequest) -> RunConfig:
    """Validate ``req`` completely and return the resolved, frozen run configuration."""
    suite = load_suite(req.suite)
    algo = _choice(req.algo, ALGO_NAMES, "algo")
    protocol = _choice(req.protocol, PROTOCOLS, "protocol")
    method = get_method(req.method)
    n_tasks = len(suite.tasks)
    n = n_tasks if req.tasks is None else req.tasks
    if not 1 <= n <= n_tasks:
        raise UsageError(f"--tasks must be in 1..{n_tasks} for suite {suite.name!r}, got {req.tasks}")
    steps = suite.steps_per_task if req.steps_per_task is None else req.steps_per_task
    if steps <= 0:
        raise UsageError(f"--steps-per-task must be > 0, got {steps}")
    if req.seed < 0:
        raise UsageError(f"--seed must be >= 0, got {req.seed}")
    _check_device(req.device)

    flags = [f"net.{k}={v}" for k, v in (("n_experts", req.n_experts), ("top_k", req.top_k)) if v is not None]
    preset = suite.presets.get(algo, "metaworld")
    presets = PPO_PRESETS if algo == "ppo" else TD3_PRESETS
    if preset not in presets:
        raise UsageError(f"suite {suite.name!r} names unknown {algo} preset {preset!r}; valid choices: {', '.join(presets)}")
    sections: dict[str, Any] = {
        "net": NetSettings(),
        "ppo": PPO_PRESETS.get(suite.presets.get("ppo", "metaworld"), PPO_PRESETS["metaworld"]),
        "td3": TD3_PRESETS.get(suite.presets.get("td3", "metaworld"), TD3_PRESETS["metaworld"]),
        "eval": EvalSettings(),
        "probe": ProbeSettings(),
    }
    regs = {k: dict(v) for k, v in ALGO_REGULARIZER_DEFAULTS.get(algo, {}).items()}
    for name, kwargs in suite.regularizers.items():
        regs[name] = {**regs.get(name, {}), **kwargs}
    bundle: tuple[str, ...] = ()
    if req.preset is not None:
        bundle = OVERRIDE_PRESETS[_choice(req.preset, tuple(OVERRIDE_PRESETS), "preset")]
    sections, regs = apply_overrides(sections, regs, [*bundle, *flags, *req.overrides], used=method.regularizers)
    check_sections(sections)
    sections["probe"] = _resolve_probe_policy(sections["probe"], suite)
    n_envs = sections[algo].n_envs
    if sections["net"].critic_moe is None:  # store the algo default explicitly in config.json
        sections["net"] = dataclasses.replace(sections["net"], critic_moe=algo == "td3")
    cfg = RunConfig(
        suite=req.suite,
        suite_data=suite.to_dict(),
        tasks=suite.task_names[:n],
        algo=algo,
        method=method.name,
        protocol=protocol,
        seed=req.seed,
        steps_per_task=steps,
        device=req.device,
        vec_env=resolve_vec_env_type(req.vec_env, n_envs),
        regularizers={k: v for k, v in regs.items()},
        reference=None if req.reference is None else str(Path(req.reference).resolve()),
        created=time.strftime("%Y%m%d-%H%M%S", time.gmtime()),
        **sections,
    )
    _check_net(cfg)
    check_regularizers(method.regularizers, {k: cfg.regularizers.get(k, {}) for k in method.regularizers})
    check_family_available(suite.family)
    check_tasks(suite)
    _check_reference(req.reference)
    return cfg


def suite_of(cfg: RunConfig) -> Suite:
    """The suite stored in a run's configuration."""
    return suite_from_dict(cfg.suite_data, source=cfg.suite)


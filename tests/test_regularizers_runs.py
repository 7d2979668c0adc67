"""Every regularizer in short PPO and TD3 runs on Pendulum and a MetaWorld v3 task: finite
parameters and its terms in the logger."""

from __future__ import annotations

import math

import gymnasium as gym
import pytest
import torch

from rl_moe.algos import MoEPPO, MoETD3
from rl_moe.policies import MoEActorCriticPolicy, MoETD3Policy
from rl_moe.regularizers import REGISTRY, make_regularizer
from tests.conftest import NETS

ARCH = NETS["three"]
#: Small budgets so resets happen within a few hundred steps.
KWARGS = {"cbp": dict(maturity=4, replacement_rate=0.05), "redo": dict(frequency=4), "sdmoe": dict(svd_every=2), "snp": dict(every_updates=2), "reset": dict(every_updates=2)}
#: The logged key of each regularizer (without the ``_actor``/``_critic`` suffix of ``both``).
KEYS = {
    "sphere": "train/loss_sphere",
    "parseval": "train/loss_parseval",
    "cbp": "train/cbp_units_replaced",
    "redo": "train/redo_units_reset",
    "cchain": "train/loss_cchain",
    "specreg": "train/loss_specreg",
    "load_balance": "train/loss_load_balance",
    "ortho": "train/loss_ortho",
    "sdmoe": "train/sdmoe_refreshes",
    "dsc": "train/loss_dsc_balance",
    "snp": "train/snp_applied",
    "l2init": "train/loss_l2init",
    "injection": "train/injection_count",
    "reset": "train/reset_count",
    "nap": "train/nap_norm_growth",
}
#: Regularizers that belong to a network kind of their own (the rest run on Top-K).
KINDS = {"sdmoe": "sdmoe", "dsc": "dsc"}


def _env(name: str) -> gym.Env:
    if name == "pendulum":
        return gym.make("Pendulum-v1")
    import metaworld  # noqa: F401  (registers the Meta-World environments)

    return gym.make("Meta-World/MT1", env_name="reach-v3", disable_env_checker=True)


def _kwargs(name: str, target: str) -> dict:
    kw = dict(KWARGS.get(name, {}))
    kw["placement" if name == "sphere" else "target"] = target
    return kw


def _check(model, name: str, suffix: str) -> None:
    values = model.logger.name_to_value
    key = KEYS[name] + suffix
    assert key in values, sorted(values)
    assert math.isfinite(float(values[key]))
    assert all(torch.isfinite(p).all() for p in model.policy.parameters())


@pytest.mark.parametrize("env_name", ["pendulum", "metaworld"])
@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_ppo_run(name: str, env_name: str) -> None:
    model = MoEPPO(
        MoEActorCriticPolicy, _env(env_name), regularizers=[make_regularizer(name, **_kwargs(name, "actor"))],
        n_steps=64, batch_size=32, n_epochs=2, policy_kwargs=dict(ARCH, critic_moe=True, moe=KINDS.get(name, "topk")), seed=0,
    )
    model.learn(192)
    _check(model, name, "")


@pytest.mark.parametrize("env_name", ["pendulum", "metaworld"])
@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_td3_run(name: str, env_name: str) -> None:
    model = MoETD3(
        MoETD3Policy, _env(env_name), regularizers=[make_regularizer(name, **_kwargs(name, "both"))],
        learning_starts=32, batch_size=32, policy_kwargs=dict(ARCH, moe=KINDS.get(name, "topk")), seed=0,
    )
    model.learn(96)
    # Per-role terms are suffixed; resets log one counter.
    suffix = "" if name in ("cbp", "redo", "sdmoe", "snp", "injection", "reset", "nap") else "_critic"
    _check(model, name, suffix)
    if suffix:
        _check(model, name, "_actor")


@pytest.mark.parametrize(
    "variant",
    [
        dict(gram="both", grad_site="hidden"),
        dict(gram="gradients", grad_site="head", coef_mode="loss_ratio"),
        dict(layer="all", features="unweighted", rho=-1e-3),
        dict(layer="joint", per_expert=True, coef_mode="fixed", rho=1e-4),
        dict(alpha=2.0, ratio_every=4),
    ],
)
def test_sphere_variants_train(variant: dict) -> None:
    arch = dict(ARCH, moe="ds", layer_norm=True, ds_granularity=2, n_shared=1)
    ppo = MoEPPO(
        MoEActorCriticPolicy, _env("pendulum"), regularizers=[make_regularizer("sphere", **variant)],
        n_steps=64, batch_size=32, n_epochs=1, policy_kwargs=arch, seed=0,
    )
    ppo.learn(128)
    _check(ppo, "sphere", "")
    td3 = MoETD3(
        MoETD3Policy, _env("pendulum"), regularizers=[make_regularizer("sphere", placement="both", **variant)],
        learning_starts=32, batch_size=32, policy_kwargs=arch, seed=0,
    )
    td3.learn(64)
    _check(td3, "sphere", "_critic")
    _check(td3, "sphere", "_actor")

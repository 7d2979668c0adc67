"""Regularizer state survives a checkpoint: saved by name, loaded into a freshly built learner."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gymnasium as gym
import pytest
import torch

from rl_moe.algos import MoEPPO, MoETD3
from rl_moe.continual.state_files import load_regularizer_state, save_regularizer_state
from rl_moe.policies import MoETD3Policy
from rl_moe.regularizers import REGISTRY, loss_context, make_regularizer
from tests.conftest import NETS, moe_ppo

ARCH = NETS["three"]
#: Settings under which each stateful regularizer changes its state within a short run.
KWARGS: dict[str, dict[str, Any]] = {
    "cbp": dict(maturity=4, replacement_rate=0.05),
    "redo": dict(frequency=3),
    "sphere": dict(coef_mode="adaptive", ratio_every=3),
    "sdmoe": dict(svd_every=2),
    "snp": dict(every_updates=2),
    "reset": dict(every_updates=2),
}
#: l2init's state (theta_0) equals a fresh same-seed learner's: tests/test_plasticity_baselines.py
#: round-trips it between seeds.
STATEFUL = ("cbp", "cchain", "redo", "specreg", "sphere", "sdmoe", "snp", "reset")


def _ppo(name: str) -> MoEPPO:
    env = gym.make("Pendulum-v1")
    reg = make_regularizer(name, **KWARGS.get(name, {}))
    return moe_ppo(env, net="three", kind=None, regularizers=[reg])


def _assert_same(a: Any, b: Any, where: str = "state") -> None:
    if isinstance(a, dict):
        assert isinstance(b, dict) and sorted(a) == sorted(b), f"{where}: keys {sorted(a)} != {sorted(b)}"
        for k in a:
            _assert_same(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            _assert_same(x, y, f"{where}[{i}]")
    elif torch.is_tensor(a):
        assert torch.equal(a, b), where
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


def _has_content(state: Any) -> bool:
    """Some tensor, positive number or non-empty container below ``state``."""
    if isinstance(state, dict):
        return any(_has_content(v) for v in state.values())
    if isinstance(state, (list, tuple)):
        return len(state) > 0
    if torch.is_tensor(state):
        return bool(state.abs().sum() > 0)
    return bool(state)


@pytest.mark.parametrize("name", STATEFUL)
def test_state_round_trips_into_a_fresh_learner(name: str, tmp_path: Path) -> None:
    model = _ppo(name)
    model.learn(192)
    state = model.regularizer_state()
    assert _has_content(state), state  # the run did change the state
    if name == "sphere":  # the learner resolved the ratio on refresh minibatches and handed it back
        assert state["0:sphere"]["ratios"]["actor"] > 0
    save_regularizer_state(tmp_path / "reg.pt", state)
    model.save(tmp_path / "ckpt.zip")

    fresh = _ppo(name)
    with pytest.raises(AssertionError):  # a fresh learner starts from another state
        _assert_same(fresh.regularizer_state(), state)
    fresh.set_parameters(str(tmp_path / "ckpt.zip"), exact_match=True)
    loaded = load_regularizer_state(tmp_path / "reg.pt")
    assert loaded is not None
    fresh.load_regularizer_state(loaded)
    # Serialised again through the *new* policy's names: every entry landed on the right object.
    _assert_same(fresh.regularizer_state(), state)


def test_stateless_regularizers_save_nothing() -> None:
    # injection's state (its count) changes only at a task boundary: tests/test_plasticity_structure.py resumes it
    for name in sorted(set(REGISTRY) - set(STATEFUL) - {"l2init", "injection"}):
        assert make_regularizer(name).state_dict(torch.nn.Linear(1, 1)) == {}, name


def test_cchain_term_is_live_right_after_a_resume(tmp_path: Path) -> None:
    # A fresh C-CHAIN has no snapshot, so its first term is zero; a resumed one must not be.
    model = _ppo("cchain")
    model.learn(128)
    save_regularizer_state(tmp_path / "reg.pt", model.regularizer_state())
    model.save(tmp_path / "ckpt.zip")
    obs = torch.randn(16, 3)

    def first_term(m: MoEPPO) -> float:
        out = m.policy.actor_net(obs)
        losses = {"policy": out.out.sum() * 0 + 1.0, "actor": out.out.sum()}
        ctx = loss_context(m, "ppo", None, {"actor": (out,)}, {"actor": losses["actor"], "critic": losses["actor"]}, losses)
        return float(m.regularizers[0].penalty(ctx)[0].loss.detach())

    fresh = _ppo("cchain")
    fresh.set_parameters(str(tmp_path / "ckpt.zip"), exact_match=True)
    assert first_term(fresh) == 0.0
    fresh.load_regularizer_state(load_regularizer_state(tmp_path / "reg.pt"))  # type: ignore[arg-type]
    assert first_term(fresh) > 0.0


def test_td3_cbp_state_covers_actor_and_critic_stacks(tmp_path: Path) -> None:
    def build() -> MoETD3:
        reg = make_regularizer("cbp", target="both", maturity=4, replacement_rate=0.05)
        return MoETD3(MoETD3Policy, gym.make("Pendulum-v1"), regularizers=[reg], learning_starts=16, batch_size=16, policy_kwargs=ARCH, seed=0)

    model = build()
    model.learn(64)
    state = model.regularizer_state()
    names = {key.rsplit("/", 1)[0] for key in state["0:cbp"]["layers"]}
    assert any(n.startswith("actor.") for n in names) and any(n.startswith("critic.") for n in names), names
    fresh = build()
    fresh.load_regularizer_state(state)
    _assert_same(fresh.regularizer_state(), state)


def test_mismatched_or_corrupt_state_is_refused(tmp_path: Path) -> None:
    model = _ppo("redo")
    with pytest.raises(ValueError, match="regularizer state holds"):
        model.load_regularizer_state({"0:cbp": {}})
    bad = tmp_path / "reg.pt"
    bad.write_bytes(b"not a torch file")
    with pytest.raises(ValueError, match="unreadable regularizer state"):
        load_regularizer_state(bad)
    assert load_regularizer_state(tmp_path / "missing.pt") is None

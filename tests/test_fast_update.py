"""The sync-free update path: static-shape MoE layers, the fast PPO update, host-sync counts, and
the standard learners against stock SB3."""

from __future__ import annotations

import copy
import warnings

import numpy as np
import pytest
import torch
from stable_baselines3 import PPO, TD3
from stable_baselines3.common.env_util import make_vec_env

from rl_moe.algos import MoEPPO, MoETD3
from rl_moe.algos.update import PPOUpdate
from rl_moe.algos.profiling import CPU_INTERNAL_SCOPES as CPU_INTERNAL, count_ops
from rl_moe.nn import NETWORK_KINDS, NetConfig, build_network, static_shapes
from rl_moe.policies import MoEActorCriticPolicy, MoETD3Policy
from rl_moe.regularizers.sphere import Sphere
from tests.conftest import NETS, moe_ppo

SMALL = NETS["small"]


def _grads(loss: torch.Tensor, net: torch.nn.Module) -> list[torch.Tensor]:
    return [g if g is not None else torch.zeros_like(p) for p, g in zip(net.parameters(), torch.autograd.grad(loss, list(net.parameters()), allow_unused=True))]


@pytest.mark.parametrize("layer_norm", [False, True])
@pytest.mark.parametrize("kind", NETWORK_KINDS)
def test_static_layout_matches_routed(kind: str, layer_norm: bool) -> None:
    torch.manual_seed(0)
    net = build_network(11, 3, NetConfig(kind=kind, layer_norm=layer_norm, **SMALL))
    x = torch.randn(37, 11)
    routed = net(x)
    g_routed = _grads(routed.out.pow(2).sum() + routed.phi().pow(2).sum(), net)
    with static_shapes():
        static = net(x)
        g_static = _grads(static.out.pow(2).sum() + static.phi().pow(2).sum(), net)
    torch.testing.assert_close(static.out, routed.out, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(static.phi(), routed.phi(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(static.probs, routed.probs)
    for a, b in zip(g_static, g_routed):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_static_layout_gives_idle_experts_exactly_zero_gradient() -> None:
    torch.manual_seed(1)
    net = build_network(5, 2, NetConfig(kind="topk", n_experts=6, top_k=1, hidden=(8,), gate_hidden=(4,)))
    x = torch.randn(3, 5)  # three states, one expert each: at least three experts idle
    with static_shapes():
        out = net(x)
        grads = torch.autograd.grad(out.out.sum(), list(net.experts.weights))
    used = set(out.indices.flatten().tolist())
    assert len(used) <= 3
    for w in grads:  # (E, in, out)
        for e in range(6):
            assert torch.count_nonzero(w[e]).item() == 0 if e not in used else torch.count_nonzero(w[e]).item() > 0


@pytest.mark.parametrize(
    "variant",
    [{}, {"features": "unweighted"}, {"layer": "all"}, {"layer": "joint"}, {"per_expert": True}, {"gram": "gradients"}],
    ids=lambda v: "-".join(f"{k}={x}" for k, x in v.items()) or "paper",
)
@pytest.mark.parametrize("kind", ["topk", "ds", "expert_choice", "soft"])
def test_static_sphere_matches_routed(kind: str, variant: dict) -> None:
    torch.manual_seed(2)
    net = build_network(11, 3, NetConfig(kind=kind, **SMALL))
    x = torch.randn(29, 11)
    sphere = Sphere(rank_every=0, **variant)

    def loss() -> torch.Tensor:
        out = net(x)
        return sphere.network_loss(out, out.out.pow(2).mean())

    routed = loss()
    g_routed = _grads(routed, net)
    with static_shapes():
        static = loss()
        g_static = _grads(static, net)
    torch.testing.assert_close(static, routed, rtol=1e-5, atol=1e-6)
    for a, b in zip(g_static, g_routed):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def _ppo(fast: str, regs: list, kind: str = "topk", policy=MoEActorCriticPolicy, **kwargs) -> MoEPPO:
    # the device stays "auto": on a GPU machine these tests check the CUDA path
    own = None if policy is MoEActorCriticPolicy else policy
    return moe_ppo(kind=kind, policy=own, regularizers=regs, fast_update=fast, **{"device": "auto", **kwargs})


REGS = {
    "none": [],
    "sphere": [Sphere(rank_every=0)],
    "sphere_fixed": [Sphere(coef_mode="fixed", rank_every=0)],
    "sphere_loss_ratio": [Sphere(coef_mode="loss_ratio", rank_every=0)],
}


@pytest.mark.parametrize("reg", list(REGS))
@pytest.mark.parametrize("kind", NETWORK_KINDS)
def test_fast_update_matches_standard(kind: str, reg: str) -> None:
    """One rollout and one update (2 epochs x 4 minibatches) through each path, same minibatches."""
    standard = _ppo("off", copy.deepcopy(REGS[reg]), kind)
    standard.learn(128)
    fast = _ppo("on", copy.deepcopy(REGS[reg]), kind)  # same seed: same init, same rollout
    updater = fast._fast_updater()
    assert updater is not None
    updater.static = True  # the GPU layout, here on the CPU
    updater.permutation = lambda n, device: torch.from_numpy(np.random.permutation(n)).to(device)
    fast.learn(128)
    for a, b in zip(standard.policy.parameters(), fast.policy.parameters()):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)
    logs_a, logs_b = standard.logger.name_to_value, fast.logger.name_to_value
    for key in ("train/policy_gradient_loss", "train/value_loss", "train/entropy_loss", "train/loss", *(k for k in logs_a if "sphere" in k)):
        assert logs_b[key] == pytest.approx(logs_a[key], rel=1e-4, abs=1e-7), key
    assert logs_b["train/clip_fraction"] == pytest.approx(logs_a["train/clip_fraction"], abs=1e-6)


def test_fast_step_has_no_host_syncs() -> None:
    """The profiler sees the standard update's syncs, and none in the fast minibatch step."""
    model = _ppo("on", [Sphere()], "topk", cuda_graphs=False)  # eager: the ops of one step are counted
    model.learn(128)
    fast = PPOUpdate(model, cuda_graphs=False, static=True)
    fast.rollout.fill(model.rollout_buffer)
    index = torch.randperm(128, device=model.device)[:32]  # a host index would be copied: a sync
    counts = count_ops(lambda: fast.step_index(index), repeat=3, exclude_scopes=CPU_INTERNAL)
    assert counts.ops > 100
    assert counts.syncs == 0, counts.sync_names
    standard = _ppo("off", [Sphere()], "topk")
    standard.learn(128)
    seen = count_ops(standard.train, exclude_scopes=CPU_INTERNAL)
    assert seen.syncs >= 8, seen.sync_names  # the routed dispatch and the logs read the device


def test_fast_update_falls_back_when_a_regularizer_needs_host_reads() -> None:
    model = _ppo("on", [Sphere(ratio_every=4)], "topk")
    assert "sphere" in (model.fast_path_reason() or "")
    assert _ppo("auto", [], "topk", device="cpu").fast_path_reason().startswith("device cpu")
    assert _ppo("on", [], "topk", target_kl=0.01).fast_path_reason() is None  # read once per epoch
    with pytest.raises(ValueError, match="fast_update 'fast'.*auto, on, off"):
        _ppo("fast", [], "topk")


@pytest.mark.parametrize("use_sde", [False, True])
@pytest.mark.parametrize("policy", ["MlpPolicy", MoEActorCriticPolicy])
def test_moeppo_without_regularizers_is_sb3_ppo(policy, use_sde: bool) -> None:
    kwargs = dict(n_steps=32, batch_size=16, n_epochs=2, seed=3, use_sde=use_sde, device="cpu")  # on CUDA the fast update runs
    if policy is MoEActorCriticPolicy:
        kwargs["policy_kwargs"] = dict(moe="topk", **SMALL)
    ours = MoEPPO(policy, make_vec_env("Pendulum-v1", n_envs=2, seed=3), regularizers=[], **kwargs).learn(192)
    stock = PPO(policy, make_vec_env("Pendulum-v1", n_envs=2, seed=3), **kwargs).learn(192)
    for a, b in zip(ours.policy.parameters(), stock.policy.parameters()):
        assert torch.equal(a, b)


@pytest.mark.parametrize("policy", ["MlpPolicy", MoETD3Policy])
def test_moetd3_without_regularizers_is_sb3_td3(policy) -> None:
    kwargs = dict(learning_starts=32, batch_size=16, train_freq=8, gradient_steps=4, seed=4, buffer_size=500, device="cpu")
    if policy is MoETD3Policy:
        kwargs["policy_kwargs"] = dict(moe="topk", **SMALL)
    else:
        kwargs["policy_kwargs"] = dict(net_arch=[32, 32])
    ours = MoETD3(policy, make_vec_env("Pendulum-v1", n_envs=1, seed=4), regularizers=[], **kwargs).learn(96)
    stock = TD3(policy, make_vec_env("Pendulum-v1", n_envs=1, seed=4), **kwargs).learn(96)
    for a, b in zip(ours.policy.parameters(), stock.policy.parameters()):
        assert torch.equal(a, b)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("reg", ["none", "sphere"])
def test_cuda_graph_update_matches_eager(reg: str) -> None:
    """Replaying the captured step gives the eager step's parameters (CUDA only).

    Only the update differs between the two runs: the rollouts act eagerly in both, since a graphed
    policy call draws its actions from other random numbers (its capture's warm-up draws too)."""
    results = []
    for graphs in (False, True):
        env = make_vec_env("Pendulum-v1", n_envs=2, seed=0)
        model = MoEPPO(
            MoEActorCriticPolicy, env, regularizers=copy.deepcopy(REGS[reg]), fast_update="on", cuda_graphs=graphs,
            n_steps=64, batch_size=32, n_epochs=2, seed=0, device="cuda", policy_kwargs=dict(moe="topk", **SMALL),
        )  # fmt: skip
        updater = model._fast_updater()
        updater.permutation = lambda n, device: torch.from_numpy(np.random.permutation(n)).to(device)
        model._acting_graph().cuda_graphs = False
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            model.learn(256)
        assert not [str(w.message) for w in caught if str(w.message).startswith("CUDA graph")]  # GraphGuard's fallbacks
        # the graphed run replayed its graph (a fallback to eager would compare eager with eager)
        assert bool(updater.graphed.enabled and updater.graphed.verified) == graphs
        results.append([p.detach().cpu() for p in model.policy.parameters()])
    for a, b in zip(*results):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_graph_update_reads_the_device_once_per_update() -> None:
    """With graphs, an update's host syncs do not grow with its minibatches (CUDA only)."""
    syncs = []
    for epochs in (1, 4):
        model = _ppo("on", [Sphere(rank_every=0)], "topk", device="cuda")
        model.n_epochs = epochs
        model.learn(128)  # captures the graph
        syncs.append(count_ops(model.train).syncs)
    assert syncs[0] == syncs[1], syncs


def test_capture_forgets_what_the_policy_kept_from_a_forward_with_gradients() -> None:
    """A probe's forward with gradients leaves its graph on SB3's action distribution; on CUDA that
    graph made the next capture fail, so it is dropped first. The MoE outputs are returned, and no
    module keeps a tensor with a graph."""
    from rl_moe.algos.update import _forget_distribution
    from rl_moe.algos.ppo_loss import ppo_losses

    model = _ppo("on", [], "topk", device="cpu")
    model.learn(128)
    batch = next(model.rollout_buffer.get(32))
    losses = ppo_losses(model, batch, 0.2, None)
    assert losses.actor_output is not None and losses.actor_output.out.grad_fn is not None
    policy = model.policy
    assert policy.action_dist.distribution.mean.grad_fn is not None
    _forget_distribution(policy)
    assert policy.action_dist.distribution is None
    kept = [v for m in policy.modules() for v in vars(m).values() if isinstance(v, torch.Tensor) and v.grad_fn is not None]
    assert kept == []


@pytest.mark.parametrize("algo", ["ppo", "td3"])
@pytest.mark.parametrize("mode", ["on", "off"])
def test_cli_setting_reaches_the_learner(mode: str, algo: str) -> None:
    from rl_moe.continual.agents import build_model
    from rl_moe.envs.factories import make_vec_env as make_task_env, task_factories
    from rl_moe.continual.resolve import RunRequest, resolve, suite_of

    overrides = (f"{algo}.fast_update={mode}",)
    cfg = resolve(RunRequest(suite="smoke", method="topk", algo=algo, tasks=1, device="cpu", preset="tiny", overrides=overrides))
    suite = suite_of(cfg)
    n_envs = getattr(cfg, algo).n_envs
    model = build_model(cfg, make_task_env(task_factories(suite, suite.tasks[0], n_envs, 0), "dummy"), "cpu")
    assert model.fast_update == mode
    if algo == "ppo":
        assert (model.fast_path_reason() is None) == (mode == "on")
    else:
        assert model.static_layout == (mode == "on")


def _td3(fast: str, regs: list, kind: str = "topk") -> MoETD3:
    kwargs = dict(learning_starts=32, batch_size=16, train_freq=8, gradient_steps=4, seed=4, buffer_size=500, device="cpu")
    return MoETD3(
        MoETD3Policy, make_vec_env("Pendulum-v1", n_envs=1, seed=4), regularizers=regs, fast_update=fast,
        policy_kwargs=dict(moe=kind, **SMALL), **kwargs,
    )  # fmt: skip


@pytest.mark.parametrize("reg", list(REGS))
@pytest.mark.parametrize("kind", ["topk", "ds", "expert_choice", "soft"])
def test_td3_static_layout_matches_routed(kind: str, reg: str) -> None:
    """TD3 in the GPU layout (static shapes, device sums) trains to the routed layout's weights."""
    runs = [_td3(fast, copy.deepcopy(REGS[reg]), kind).learn(96) for fast in ("off", "on")]
    for a, b in zip(runs[0].policy.parameters(), runs[1].policy.parameters()):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5)
    logs = [r.logger.name_to_value for r in runs]
    for key in ("train/critic_loss", "train/actor_loss", *(k for k in logs[0] if "sphere" in k)):
        assert logs[1][key] == pytest.approx(logs[0][key], rel=1e-3, abs=1e-6), key


def test_td3_train_reads_the_device_once_per_call() -> None:
    """Host syncs of a TD3 ``train`` call do not grow with its gradient steps (static layout)."""
    model = _td3("on", [Sphere(rank_every=0)])
    model.learn(64)
    syncs = [count_ops(lambda: model.train(steps, 16), exclude_scopes=CPU_INTERNAL).syncs for steps in (2, 8)]
    # the sums, the NaN guard's one reduction, and SPHERE's tr(A_last) (train/sphere_trace, once per call)
    assert syncs[0] == syncs[1] and syncs[0] <= 5, syncs


@pytest.mark.parametrize("fast", ["off", "on"])
def test_target_kl_stops_after_the_epoch_that_exceeds_it(fast: str) -> None:
    """target_kl is read once per epoch: a tiny one stops after the first whole epoch (4
    minibatches of 32 over 128 rows), a huge one lets all four epochs run, on both minibatch sources."""
    steps = {}
    for target in (1e-12, 1e9):
        model = _ppo(fast, [], "topk", target_kl=target)
        model.n_epochs = 4
        model._setup_learn(128, None)
        calls = []
        step = model.policy.optimizer.step
        model.policy.optimizer.step = lambda *a, **k: (calls.append(1), step(*a, **k))[1]
        model.collect_rollouts(model.env, model._init_callback(None), model.rollout_buffer, n_rollout_steps=64)
        model.train()
        steps[target] = (len(calls), model._n_updates)
    assert steps[1e-12] == (4, 1)
    assert steps[1e9] == (16, 4)

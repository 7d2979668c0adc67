"""Rollouts with the device buffer and graphed acting (rl_moe/algos/rollout.py) against SB3's own."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
import torch
from stable_baselines3.common.buffers import RolloutBuffer
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.vec_env import VecEnv

from rl_moe.algos import MoEPPO
from rl_moe.algos.update import no_distribution_checks
from rl_moe.algos.profiling import SYNC_OPS, count_ops
from rl_moe.algos.rollout import DeviceRolloutBuffer, GraphedActing
from rl_moe.continual.evaluation import EvalEnvs, evaluate
from rl_moe.nn import static_shapes
from rl_moe.policies import MoEActorCriticPolicy
from tests.conftest import NETS, moe_ppo

SMALL = NETS["small"]
#: Every array the rollout writes (SB3's ``RolloutBuffer``), in its (T, n_envs, ...) layout.
ARRAYS = ("observations", "actions", "rewards", "episode_starts", "values", "log_probs", "advantages", "returns")


def _pendulum() -> VecEnv:
    return make_vec_env("Pendulum-v1", n_envs=2, seed=0)  # 200-step episodes end by time limit


def _metaworld() -> VecEnv:
    from rl_moe.envs.factories import make_vec_env as make_task_env, task_factories
    from rl_moe.continual.resolve import RunRequest, resolve, suite_of

    suite = suite_of(resolve(RunRequest(suite="cw10-cw", method="topk", tasks=1, device="cpu")))
    return make_task_env(task_factories(suite, suite.tasks[0], 2, 0), "dummy")  # 500-step episodes


def _sb3_buffer(fast: str, env: VecEnv, n_steps: int, **kwargs) -> MoEPPO:
    """The learner with SB3's own ``RolloutBuffer`` (the reference)."""
    return _ppo(fast, env, n_steps, rollout_buffer_class=RolloutBuffer, **kwargs)


def _ppo(fast: str, env: VecEnv, n_steps: int, **kwargs) -> MoEPPO:
    return moe_ppo(env, regularizers=[], fast_update=fast, n_steps=n_steps, batch_size=64, n_epochs=1, **kwargs)


class _StopAt(BaseCallback):
    """Stops the rollout at its ``stop``-th step (None: never)."""

    def __init__(self, stop: int | None = None) -> None:
        super().__init__()
        self.stop = stop

    def _on_step(self) -> bool:
        return self.stop is None or self.n_calls < self.stop


def _collect(model: MoEPPO, n_steps: int, callback: BaseCallback | None = None) -> bool:
    _, cb = model._setup_learn(n_steps * model.n_envs, callback)
    return model.collect_rollouts(model.env, cb, model.rollout_buffer, n_steps)  # type: ignore[arg-type]


@pytest.mark.parametrize("make_env, n_steps", [(_pendulum, 256), (_metaworld, 512)], ids=["pendulum", "metaworld"])
def test_device_buffer_fills_the_buffer_bit_identically_to_sb3(make_env: Callable[[], VecEnv], n_steps: int) -> None:
    """Same seed, one rollout each, episodes ending by time limit inside it (the bootstrapped rewards)."""
    sb3 = _sb3_buffer("off", make_env(), n_steps)
    assert type(sb3.rollout_buffer) is RolloutBuffer and sb3._acting_graph() is None
    assert _collect(sb3, n_steps)
    ours = _ppo("on", make_env(), n_steps)
    assert isinstance(ours.rollout_buffer, DeviceRolloutBuffer) and isinstance(ours._acting_graph(), GraphedActing)
    assert _collect(ours, n_steps)
    for name in ARRAYS:
        np.testing.assert_array_equal(getattr(ours.rollout_buffer, name), getattr(sb3.rollout_buffer, name), err_msg=name)
    assert sb3.rollout_buffer.episode_starts[1:].any()  # an episode ended inside the rollout
    assert ours.num_timesteps == sb3.num_timesteps == n_steps * 2
    assert ours.rollout_buffer.full and ours.rollout_buffer.pos == n_steps
    np.testing.assert_array_equal(ours._last_obs, sb3._last_obs)
    np.testing.assert_array_equal(ours._last_episode_starts, sb3._last_episode_starts)
    assert [(e["r"], e["l"]) for e in ours.ep_info_buffer] == [(e["r"], e["l"]) for e in sb3.ep_info_buffer]


def test_device_buffer_keeps_a_rollout_a_callback_stopped() -> None:
    sb3 = _sb3_buffer("off", _pendulum(), 64)  # each seeds the global generators: build, then collect
    assert _collect(sb3, 64, _StopAt(10)) is False
    ours = _ppo("on", _pendulum(), 64)
    assert _collect(ours, 64, _StopAt(10)) is False
    assert ours.num_timesteps == sb3.num_timesteps == 20
    assert ours.rollout_buffer.pos == sb3.rollout_buffer.pos == 9
    for name in ("observations", "actions", "values", "log_probs"):
        np.testing.assert_array_equal(getattr(ours.rollout_buffer, name)[:9], getattr(sb3.rollout_buffer, name)[:9], err_msg=name)


def test_device_buffer_reads_the_device_once_per_step() -> None:
    """Counts the host copies (``Tensor.cpu``) of one 64-step rollout: SB3's buffer copies actions,
    values and log-probabilities every step; with the device buffer a step copies the actions, and
    the rest is copied once."""
    counts = {}
    original = torch.Tensor.cpu
    for fast in ("off", "on"):
        model = (_sb3_buffer if fast == "off" else _ppo)(fast, _pendulum(), 64)
        calls = [0]

        def counting(self: torch.Tensor, *args, **kwargs):  # noqa: ANN002, ANN003
            calls[0] += 1
            return original(self, *args, **kwargs)

        torch.Tensor.cpu = counting  # type: ignore[method-assign]
        try:
            _collect(model, 64)
        finally:
            torch.Tensor.cpu = original  # type: ignore[method-assign]
        counts[fast] = calls[0]
    assert counts["off"] >= 3 * 64
    assert 64 <= counts["on"] <= 64 + 3, counts  # + values, log-probs, last values


def test_graphed_acting_runs_where_the_device_update_runs() -> None:
    assert _ppo("auto", _pendulum(), 64)._acting_graph() is None  # CPU: eager acting
    assert _ppo("on", _pendulum(), 64, use_sde=True)._acting_graph() is None
    model = _ppo("on", _pendulum(), 64)
    acting = model._acting_graph()
    assert acting is not None and acting is model._acting_graph()  # kept between rollouts
    assert not acting.cuda_graphs  # graphs only on CUDA
    assert model.rollout_buffer.device_values.shape == (64, 2)
    assert "_acting" in model._excluded_save_params()


def test_device_buffer_survives_save_and_load(tmp_path) -> None:
    model = _ppo("on", _pendulum(), 64)
    model.learn(128)
    model.save(tmp_path / "m.zip")
    loaded = MoEPPO.load(tmp_path / "m.zip", env=_pendulum(), device="cpu")
    assert isinstance(loaded.rollout_buffer, DeviceRolloutBuffer)
    loaded.learn(128)  # a rollout and an update with the reloaded buffer


def test_installed_graph_forward_is_removed_afterwards() -> None:
    """The graphed forward is an instance attribute only while a rollout runs (here with graphs
    forced on a CPU and a fake capture, which replays the eager call)."""
    model = _ppo("on", _pendulum(), 32)
    acting = model._acting_graph()
    acting.cuda_graphs = True
    with acting.installed():
        assert "forward" in vars(model.policy)
    assert "forward" not in vars(model.policy)


def test_collector_in_the_static_layout_has_no_value_reads() -> None:
    """With the GPU's static MoE layout (here on a CPU) nothing in a rollout step reads a tensor's
    value on the host: the routed dispatch's ``nonzero`` and the distribution checks are gone."""
    model = _ppo("on", _pendulum(), 32)
    model._fast_updater().static = True
    _, cb = model._setup_learn(64, None)
    counts = count_ops(lambda: model.collect_rollouts(model.env, cb, model.rollout_buffer, 32))
    assert counts.ops > 32 * 50
    assert counts.syncs == 0, counts.sync_names
    standard = _sb3_buffer("off", _pendulum(), 32)
    _, cb = standard._setup_learn(64, None)
    assert count_ops(lambda: standard.collect_rollouts(standard.env, cb, standard.rollout_buffer, 32)).syncs >= 32


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_graph_acting_matches_the_policy() -> None:
    """The replayed policy call gives the eager values and the log-probabilities of its own sampled
    actions, also after the parameters change in place (CUDA only)."""
    model = MoEPPO(
        MoEActorCriticPolicy, _pendulum(), regularizers=[], n_steps=64, batch_size=32, n_epochs=1, seed=0,
        device="cuda", policy_kwargs=dict(moe="topk", **SMALL),
    )  # fmt: skip
    acting = model._acting_graph()
    assert acting is not None and acting.cuda_graphs
    obs = torch.from_numpy(np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32)).cuda()
    for _ in range(2):
        with torch.no_grad(), static_shapes(True), no_distribution_checks():  # as collect_rollouts runs it
            acted = acting._acting(model.policy.forward, obs)(obs)
            assert acting._captured is not None
            values, log_prob, _ = model.policy.evaluate_actions(obs, acted.actions)
        torch.testing.assert_close(acted.values, values, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(acted.log_probs, log_prob, rtol=1e-5, atol=1e-5)
        with torch.no_grad():
            for p in model.policy.parameters():
                p.add_(0.01)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_rollout_reads_the_device_once_per_step() -> None:
    """A rollout step waits for the device only to copy: SB3's upload of the observations (from
    pageable memory, a blocking copy) and the download of the actions. No value is read per step
    (CUDA only)."""
    counts = []
    for n_steps in (16, 64):
        model = MoEPPO(
            MoEActorCriticPolicy, _pendulum(), regularizers=[], n_steps=n_steps, batch_size=16, n_epochs=1, seed=0,
            device="cuda", policy_kwargs=dict(moe="topk", **SMALL),
        )  # fmt: skip
        _collect(model, n_steps)  # captures the graph
        _, cb = model._setup_learn(n_steps * 2, None)
        counts.append(count_ops(lambda: model.collect_rollouts(model.env, cb, model.rollout_buffer, n_steps)))
    extra_steps = 64 - 16
    reads = [sum(v for k, v in c.sync_names.items() if k in SYNC_OPS) for c in counts]
    assert reads[1] == reads[0], [c.sync_names for c in counts]
    assert counts[1].syncs - counts[0].syncs <= 2 * extra_steps, [c.sync_names for c in counts]



class _CheckFlag(BaseCallback):
    """Records whether torch.distributions validates arguments, at every rollout step."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[bool] = []

    def _on_step(self) -> bool:
        self.seen.append(bool(torch.distributions.Distribution._validate_args))
        return True


class PendulumEvalEnvs(EvalEnvs):
    """Evaluation envs over Pendulum (200-step episodes), for evaluate()."""

    def __init__(self) -> None:
        super().__init__([None, None])  # type: ignore[list-item]

    def get(self, k: int) -> VecEnv:
        return make_vec_env("Pendulum-v1", n_envs=k, seed=1)


def test_cpu_rollouts_and_evaluations_build_distributions_without_argument_checks(monkeypatch: pytest.MonkeyPatch) -> None:
    """The per-step argument check (a host sync, ~5% of a policy call at batch 8) is off while a CPU
    rollout or an evaluation acts, and the process default is back afterwards."""
    default = torch.distributions.Distribution._validate_args
    model = moe_ppo()
    assert model.fast_path_reason() is not None  # the CPU rollout: SB3's, not the device path
    flags = _CheckFlag()
    model.learn(64 * 2, callback=flags)
    assert flags.seen and not any(flags.seen)
    assert torch.distributions.Distribution._validate_args == default

    seen: list[bool] = []
    predict = model.predict

    def recording(obs, deterministic=True):  # type: ignore[no-untyped-def]
        seen.append(bool(torch.distributions.Distribution._validate_args))
        return predict(obs, deterministic=deterministic)

    monkeypatch.setattr(model, "predict", recording)
    assert evaluate(model, PendulumEvalEnvs(), 2).n_episodes == 2
    assert seen and not any(seen)
    assert torch.distributions.Distribution._validate_args == default

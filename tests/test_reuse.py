"""rl_moe.nn.reuse: values of the weights alone are reused only inside a ``weights_fixed`` scope,
and never returned stale after an update, whichever way the update writes the weights."""

from __future__ import annotations

import copy
from collections.abc import Callable

import gymnasium as gym
import numpy as np
import pytest
import torch
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.utils import polyak_update

from rl_moe.algos import MoETD3
from rl_moe.continual.evaluation import evaluate
from rl_moe.nn import NetConfig, build_network
from rl_moe.nn.reuse import ScopedValue, reuse_key, weights_fixed
from rl_moe.policies import MoETD3Policy
from tests.conftest import NETS, moe_ppo
from tests.test_rollout import PendulumEvalEnvs

#: The networks that reuse a value of their weights: (network kind, other NetConfig fields).
REUSERS: dict[str, tuple[str, dict[str, object]]] = {
    "specnorm": ("topk", {"spectral_norm": True}),
    "ssmoe": ("ssmoe", {}),
    "sdmoe": ("sdmoe", {"sd_rank_fraction": 0.1}),
}


def _policy_kwargs(name: str) -> dict[str, object]:
    kind, fields = REUSERS[name]
    return {"moe": kind, **NETS["small"], **fields}


def _counted(calls: list[int], value: Callable[[], torch.Tensor]) -> Callable[[], torch.Tensor]:
    return lambda: calls.append(1) or value()


def test_reused_only_within_one_scope() -> None:
    w = torch.nn.Parameter(torch.randn(3, 4))
    calls: list[int] = []
    compute = _counted(calls, lambda: w.detach() * 2)
    cache: ScopedValue[torch.Tensor] = ScopedValue()
    cache.get(lambda: (w,), compute)
    cache.get(lambda: (w,), compute)
    assert len(calls) == 2  # outside a scope: every call computes
    with weights_fixed():
        first = cache.get(lambda: (w,), compute)
        with weights_fixed():  # nested: the outer scope holds
            assert cache.get(lambda: (w,), compute) is first
        assert cache.get(lambda: (w,), compute) is first and len(calls) == 3
    with weights_fixed():  # a new scope: computed again
        assert cache.get(lambda: (w,), compute) is not first and len(calls) == 4
    assert reuse_key((w,)) is None


def test_a_scopes_values_are_let_go_when_it_closes() -> None:
    """Nothing stored in a scope is returned after it, so the outermost exit frees the values
    (as large as the weights for a spectral norm) instead of holding them until the next scope."""
    import gc
    import weakref

    w = torch.nn.Parameter(torch.randn(3, 4))
    cache: ScopedValue[torch.Tensor] = ScopedValue()
    with weights_fixed():
        value = cache.get(lambda: (w,), lambda: w.detach() * 2)
        alive = weakref.ref(value)
        del value
        with weights_fixed():
            pass  # a nested exit keeps the outer scope's values
        assert alive() is not None and cache.get(lambda: (w,), lambda: w.detach() * 3) is alive()
    gc.collect()
    assert alive() is None
    with pytest.raises(RuntimeError), weights_fixed():  # a block that raises lets go too
        value = cache.get(lambda: (w,), lambda: w.detach() * 2)
        alive = weakref.ref(value)
        del value
        raise RuntimeError
    gc.collect()
    assert alive() is None


def test_a_closing_scope_keeps_what_another_threads_open_scope_stored() -> None:
    import threading

    w = torch.nn.Parameter(torch.randn(3, 4))
    cache: ScopedValue[torch.Tensor] = ScopedValue()
    stored, closed = threading.Event(), threading.Event()
    seen: list[torch.Tensor] = []

    def other() -> None:
        with weights_fixed():
            seen.append(cache.get(lambda: (w,), lambda: w.detach() * 2))
            stored.set()
            closed.wait(10)
            seen.append(cache.get(lambda: (w,), lambda: w.detach() * 3))  # still its own scope's value

    with weights_fixed():
        cache.get(lambda: (w,), lambda: w.detach() * 5)
        thread = threading.Thread(target=other)
        thread.start()
        stored.wait(10)
    closed.set()  # this thread's scope has closed after the other thread stored its value
    thread.join(10)
    assert len(seen) == 2 and seen[1] is seen[0]


def test_in_scope_changes_that_are_visible_still_recompute() -> None:
    """A load (in place: the version moves), new storage, or another tensor in the same place
    each compute again inside a scope."""
    w, b = torch.nn.Parameter(torch.randn(3, 4)), torch.randn(4)
    calls: list[int] = []
    compute = _counted(calls, lambda: (w.detach() * 2 + b).sum(0))
    cache: ScopedValue[torch.Tensor] = ScopedValue()
    with weights_fixed():
        cache.get(lambda: (w, b), compute)
        with torch.no_grad():
            w.copy_(torch.randn(3, 4))
        assert torch.equal(cache.get(lambda: (w, b), compute), (w.detach() * 2 + b).sum(0)) and len(calls) == 2
        w.data = torch.randn(3, 4)
        assert torch.equal(cache.get(lambda: (w, b), compute), (w.detach() * 2 + b).sum(0)) and len(calls) == 3
        cache.get(lambda: (w, b.clone()), compute)
        assert len(calls) == 4


def test_no_reuse_in_a_torch_func_transform_inference_mode_or_a_copy() -> None:
    w = torch.randn(5)
    cache: ScopedValue[torch.Tensor] = ScopedValue()
    with weights_fixed():
        cache.get(lambda: (w,), lambda: w * 2)
        seen = []

        def f(x: torch.Tensor) -> torch.Tensor:
            seen.append(reuse_key((x,)))
            return cache.get(lambda: (x,), lambda: x * 3)

        torch.func.vmap(f)(torch.randn(2, 5))
        assert seen == [None]  # the wrapped tensor stands for each batch's own value
        with torch.inference_mode():
            assert reuse_key((w,)) is None
            made_there = torch.randn(5)
        assert reuse_key((made_there,)) is None  # an inference tensor has no version
        calls: list[int] = []
        copy.deepcopy(cache).get(lambda: (w,), _counted(calls, lambda: w * 2))
        assert calls == [1]  # a copy starts empty: its tensors would be other tensors


def _net(name: str, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    kind, fields = REUSERS[name]
    return build_network(11, 3, NetConfig(kind=kind, **{**NETS["small"], **fields}))  # type: ignore[arg-type]


def _acting(net: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """Two calls as a rollout makes them; the second must reuse (and equal) the first's value."""
    net.eval()
    with torch.no_grad(), weights_fixed():
        first = net(x).out
        assert torch.equal(net(x).out, first)
    return first


def _fresh(net: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The same call on a copy, which holds nothing reused."""
    other = copy.deepcopy(net).eval()
    with torch.no_grad():
        return other(x).out


@pytest.mark.parametrize("name", sorted(REUSERS))
def test_the_next_scope_sees_a_fused_adam_step_and_a_polyak_update(name: str) -> None:
    """The two writes the parameters' versions do not record (fused Adam; SB3's ``polyak_update``,
    through ``.data``): the next rollout's calls compute with the new weights."""
    net, x = _net(name), torch.randn(8, 11)
    opt = torch.optim.Adam(net.parameters(), lr=0.05, fused=True)
    before = _acting(net, x)
    versions = [p._version for p in net.parameters()]
    net.train()
    opt.zero_grad()
    net(x).out.pow(2).sum().backward()
    opt.step()
    assert [p._version for p in net.parameters()] == versions  # the reason a version key fails
    after = _acting(net, x)
    assert not torch.equal(after, before) and torch.equal(after, _fresh(net, x))
    polyak_update(_net(name, seed=1).parameters(), net.parameters(), 0.5)
    averaged = _acting(net, x)
    assert not torch.equal(averaged, after) and torch.equal(averaged, _fresh(net, x))


@pytest.mark.parametrize("name", sorted(REUSERS))
def test_functional_call_with_other_weights_inside_a_scope(name: str) -> None:
    """A probe may call the network with other weights (``torch.func.functional_call``) inside a
    rollout's scope: it gets those weights' output, and the network's own reused value is intact."""
    net, other, x = _net(name), _net(name, seed=1), torch.randn(8, 11)
    other.eval()
    with torch.no_grad():
        expected = other(x).out
    own = _acting(net, x)
    with torch.no_grad(), weights_fixed():
        net(x)
        swapped = torch.func.functional_call(net, {**dict(other.named_parameters()), **dict(other.named_buffers())}, (x,)).out
        again = net(x).out
    assert torch.equal(swapped, expected) and torch.equal(again, own)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_cuda_graph_capture_computes_its_own_value() -> None:
    """Warm-up calls before a capture fill the entry; the capture must not bake that tensor into
    the graph, or every replay would read a value of the weights at capture time."""
    w, calls = torch.randn(4, device="cuda"), []
    cache: ScopedValue[torch.Tensor] = ScopedValue()
    with weights_fixed():
        cache.get(lambda: (w,), _counted(calls, lambda: w * 2))
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = cache.get(lambda: (w,), _counted(calls, lambda: w * 2))
    assert len(calls) == 2
    w.mul_(3)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, w * 2)


@pytest.mark.parametrize("name", sorted(REUSERS))
def test_within_a_scope_the_value_is_computed_once(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    computed: list[int] = []
    real = ScopedValue.get
    monkeypatch.setattr(ScopedValue, "get", lambda self, tensors, compute: real(self, tensors, _counted(computed, compute)))
    net, x = _net(name), torch.randn(8, 11)
    _acting(net, x)
    once = len(computed)
    with torch.no_grad(), weights_fixed():
        for _ in range(5):
            net(x)
    assert once >= 1 and len(computed) == 2 * once  # one scope, one value per reusing module


class _AgainstFresh(BaseCallback):
    """At every env step of a collection (inside its scope), the acting network's output on the
    step's observations against a copy's: any stale reuse shows as a difference."""

    def __init__(self, net: Callable[[], torch.nn.Module], obs: Callable[[], torch.Tensor]) -> None:
        super().__init__()
        self.net, self.obs = net, obs
        self.checked, self.worst, self.outside = 0, 0.0, 0

    def _on_step(self) -> bool:
        self.outside += reuse_key(()) is None  # the collection holds its scope open
        net, x = self.net(), self.obs()
        with torch.no_grad():
            used = net(x).out
        self.worst = max(self.worst, float((used - _fresh(net, x)).abs().max()))
        self.checked += 1
        return True


@pytest.mark.parametrize("fast", ["off", "on"])
@pytest.mark.parametrize("name", sorted(REUSERS))
def test_ppo_rollouts_after_updates_act_on_the_current_weights(name: str, fast: str) -> None:
    """SB3's rollout and the device-batch one (``cw10``'s)."""
    model = moe_ppo(net="small", kind=None, policy_kwargs=_policy_kwargs(name), fast_update=fast)
    assert (model.fast_path_reason() is None) == (fast == "on")
    check = _AgainstFresh(lambda: model.policy.mlp_extractor.actor_net, lambda: torch.as_tensor(model._last_obs, dtype=torch.float32))
    model.learn(3 * 64 * 2, callback=check)  # three rollouts, two fused-Adam updates between them
    assert check.checked == 3 * 64 and check.worst == 0.0 and check.outside == 0


@pytest.mark.parametrize("name", sorted(REUSERS))
def test_td3_collections_after_updates_act_on_the_current_weights(name: str) -> None:
    model = MoETD3(MoETD3Policy, gym.make("Pendulum-v1"), regularizers=[], learning_starts=16, batch_size=16, seed=0,
                   device="cpu", policy_kwargs=_policy_kwargs(name))
    check = _AgainstFresh(lambda: model.actor.net, lambda: torch.as_tensor(model._last_obs, dtype=torch.float32))
    model.learn(48, callback=check)  # a gradient step (fused Adam) and a Polyak update after every step
    assert check.checked == 48 and check.worst == 0.0 and check.outside == 0


def _scopes_of_predict(model: object, monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """The scope (``reuse_key(())``) each later ``model.predict`` call runs in, in call order."""
    scopes: list[object] = []
    predict = model.predict  # type: ignore[attr-defined]

    def recording(obs, state=None, episode_start=None, deterministic=False):  # type: ignore[no-untyped-def]
        scopes.append(reuse_key(()))
        return predict(obs, deterministic=deterministic)

    monkeypatch.setattr(model, "predict", recording)
    return scopes


def test_an_evaluation_holds_one_scope_open(monkeypatch: pytest.MonkeyPatch) -> None:
    model = moe_ppo()
    scopes = _scopes_of_predict(model, monkeypatch)
    assert evaluate(model, PendulumEvalEnvs(), 2).n_episodes == 2
    assert len(scopes) == 200 and scopes[0] is not None and set(scopes) == {scopes[0]}
    assert reuse_key(()) is None


class _BlankFrames:
    """A renderer that draws nothing: the scope is what is checked, not the pictures."""

    def frame(self, data: object) -> np.ndarray:
        return np.zeros((2, 2, 3), dtype=np.uint8)


def test_offline_episodes_hold_one_scope_open(monkeypatch: pytest.MonkeyPatch) -> None:
    """``rl_moe.experts``' visited-state episodes and ``rl_moe.recording``'s episode act inside one
    scope each (specnorm, SSMoE and SD-MoE then compute their value once per episode set)."""
    from rl_moe.experts import visited_states
    from rl_moe.recording import VideoSettings, record_episode

    model = moe_ppo()
    scopes = _scopes_of_predict(model, monkeypatch)
    states = visited_states(model, [lambda: gym.make("Pendulum-v1")] * 2, None, 30)
    assert tuple(states.shape) == (60, 3) and len(scopes) == 30 and scopes[0] is not None and set(scopes) == {scopes[0]}
    first, env = scopes[0], gym.make("Pendulum-v1")
    env.unwrapped.model = env.unwrapped.data = None  # type: ignore[attr-defined]  # what the renderer is handed
    scopes.clear()
    episode = record_episode(model, env, lambda _: _BlankFrames(), VideoSettings(steps=20, stride=5), 200)
    assert len(episode.frames) == 1 + 4 and len(scopes) == 20 and scopes[0] not in (None, first) and set(scopes) == {scopes[0]}
    assert reuse_key(()) is None

"""Captured CUDA graphs check themselves on their first replay against an eager call, and fall
back to eager with one warning on a mismatch. Tested on a CPU with a fake capture whose replay
runs the captured function eagerly (a faithful graph) or perturbs its result (a broken one)."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch

from rl_moe.algos import MoEPPO
from rl_moe.algos import graphs as graphs_module
from rl_moe.algos import rollout as rollout_module
from rl_moe.regularizers import Sphere
from tests.conftest import moe_ppo



class FakeGraph:
    """Replays ``fn`` eagerly into the first call's outputs, as a CUDA graph writes its static
    outputs; ``broken`` then corrupts what the replay produced."""

    def __init__(self, fn: Callable[[], Any], broken: Callable[[Any], None] | None) -> None:
        self.fn, self.broken = fn, broken
        self.out = fn()

    def replay(self) -> None:
        new = self.fn()
        if isinstance(self.out, tuple):
            for o, n in zip(self.out, new):
                o.copy_(n)
        if self.broken is not None:
            self.broken(self.out)


def fake_capture(broken: Callable[[Any], None] | None) -> Callable[..., tuple[FakeGraph, Any]]:
    def capture(fn: Callable[[], Any], device: torch.device, warmup: int = 0) -> tuple[FakeGraph, Any]:
        graph = FakeGraph(fn, broken)
        return graph, graph.out

    return capture


def _ppo(seed: int = 0) -> MoEPPO:
    return moe_ppo(net="tiny", regularizers=[Sphere(rank_every=0)], fast_update="on", seed=seed)


def _shift_weights(model: MoEPPO) -> Callable[[Any], None]:
    def broken(_: Any) -> None:
        with torch.no_grad():
            next(model.policy.parameters()).add_(1e-3)  # a stale input or a missed op: a visible error

    return broken


@pytest.mark.parametrize("faithful", [True, False])
def test_update_graph_checks_its_first_replay(faithful: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    reference = _ppo()
    reference._fast_updater().static = True
    reference.learn(128)  # eager fast update: the weights every faithful path must reach
    model = _ppo()
    updater = model._fast_updater()
    updater.static, updater.graphed.enabled = True, True  # the CUDA path, on a CPU
    monkeypatch.setattr(graphs_module, "capture", fake_capture(None if faithful else _shift_weights(model)))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.learn(128)
    messages = [str(w.message) for w in caught if "first replay" in str(w.message)]
    if faithful:
        assert not messages and updater.graphed.enabled and updater.graphed.verified == {32}
    else:
        assert len(messages) == 1 and "PPO update" in messages[0]
        assert not updater.graphed.enabled and not updater.graphed.graphs
    # Either way the update equals the eager one: the broken replay was undone.
    for a, b in zip(reference.policy.parameters(), model.policy.parameters()):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("faithful", [True, False])
def test_acting_graph_checks_its_first_replay(faithful: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    def shift_values(out: Any) -> None:
        out.values.add_(0.5)

    model = _ppo()
    acting = model._acting_graph()
    assert acting is not None
    acting.cuda_graphs = True  # the CUDA path, on a CPU
    monkeypatch.setattr(rollout_module, "capture", fake_capture(None if faithful else shift_values))
    obs = torch.from_numpy(np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32))
    with warnings.catch_warnings(record=True) as caught, torch.no_grad():
        warnings.simplefilter("always")
        act = acting._acting(model.policy.forward, obs)
    messages = [str(w.message) for w in caught if "first replay" in str(w.message)]
    if faithful:
        assert not messages and act is acting._captured and acting.cuda_graphs
    else:
        assert len(messages) == 1 and "rollout acting" in messages[0]
        assert act is None and not acting.cuda_graphs and acting._captured is None


def _refusing_capture(fn: Callable[[], Any], device: torch.device, warmup: int = 0) -> Any:
    raise RuntimeError("operation not permitted when stream is capturing")


def test_a_refused_capture_falls_back_to_eager_with_one_warning(monkeypatch: pytest.MonkeyPatch) -> None:
    """Both graphed pieces share one fallback rule (graphs.GraphGuard): a capture that refuses an
    op warns once, and the update and the acting then run eagerly with the eager results."""
    reference = _ppo()
    reference._fast_updater().static = True
    reference.learn(128)
    model = _ppo()
    updater = model._fast_updater()
    updater.static, updater.graphed.enabled = True, True
    monkeypatch.setattr(graphs_module, "capture", _refusing_capture)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.learn(128)
    messages = [str(w.message) for w in caught if "capture" in str(w.message) and "failed" in str(w.message)]
    assert len(messages) == 1 and "PPO update" in messages[0]
    assert not updater.graphed.enabled and not updater.graphed.graphs
    for a, b in zip(reference.policy.parameters(), model.policy.parameters()):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)

    acting = model._acting_graph()
    assert acting is not None
    acting.cuda_graphs = True
    monkeypatch.setattr(rollout_module, "capture", _refusing_capture)
    obs = torch.zeros(2, 3)
    with warnings.catch_warnings(record=True) as caught, torch.no_grad():
        warnings.simplefilter("always")
        assert acting._acting(model.policy.forward, obs) is None
    assert sum("rollout acting" in str(w.message) for w in caught) == 1 and not acting.cuda_graphs

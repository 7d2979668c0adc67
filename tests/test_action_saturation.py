"""tools/action_saturation.py: the share of action means outside MetaWorld's box."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch.distributions import Normal

from tools import action_saturation


class _FixedPolicy:
    """A policy whose Gaussian has the given mean and std whatever the state."""

    def __init__(self, mean: torch.Tensor, std: torch.Tensor) -> None:
        self.mean, self.std = mean, std

    def get_distribution(self, states: torch.Tensor) -> SimpleNamespace:
        n = states.shape[0]
        return SimpleNamespace(distribution=Normal(self.mean.expand(n, -1), self.std.expand(n, -1)))


def test_known_answer() -> None:
    policy = _FixedPolicy(torch.tensor([0.5, -2.0, 3.0, 0.1]), torch.tensor([1.0, 0.5, 0.5, 1.0]))
    out = action_saturation.saturation(policy, torch.zeros(7, 39))
    assert out["outside_box"] == pytest.approx(0.5)
    assert out["max_abs_mean"] == pytest.approx(3.0)
    assert out["median_abs_mean"] == pytest.approx(0.5)  # torch's median: the lower of the middle two
    assert out["std"] == pytest.approx(0.75)


def test_mean_inside_box_is_zero() -> None:
    policy = _FixedPolicy(torch.full((4,), 0.99), torch.ones(4))
    assert action_saturation.saturation(policy, torch.zeros(3, 39))["outside_box"] == 0.0

"""Resets of the last layers (Nikishin et al. 2022, "The primacy bias in deep reinforcement
learning", ICML, arXiv:2205.07802).

The last ``layers`` linear layers of every expert (1: the heads; 2: the heads and the last hidden
layer, ...) are drawn afresh from their initial distribution, at each task boundary (from the
second task on) or every ``every_updates`` optimizer steps, and the optimizer state of those
tensors is reset with them (Adam's moments and step counter to 0, as for a fresh parameter).

Choices the paper leaves open, as taken here: on a MoE the unit is the layer of every expert at
once (all E experts' last layers are reset together; no expert is kept); the gate's output layer
(the router logits) is reset too with ``gate=True`` (off by default: the paper's networks have no
router); a reset hidden layer's LayerNorm affine goes back to (1, 0); TD3's target networks take
the reset values (the paper resets the target critic with the critic). Fresh weights are drawn
as at construction (orthogonal per expert with the layer's gain, bias 0) from a generator seeded
by ``seed`` and the number of resets so far, so a resumed run resets as the uninterrupted one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from rl_moe.nn.experts import ACTIVATION_GAINS
from rl_moe.nn.parts import MoENetwork
from rl_moe.nn.specnorm import expert_stacks
from rl_moe.policies import policy_roles
from rl_moe.regularizers.hooks import GRADIENT_STEP_PHASES
from rl_moe.regularizers.targets import Targeted, check_target

#: Optimizer state entries reset with a parameter (Adam's).
_STATE = ("exp_avg", "exp_avg_sq", "max_exp_avg_sq", "step")


@dataclass(frozen=True)
class ResetConfig:
    """Reset settings.

    :param layers: k, the last linear layers of every expert reset (1: the heads); more than an
        expert's depth resets the whole expert
    :param gate: also reset the gate's output layer (the router logits)
    :param every_updates: 0: at each task boundary (from the second task on); N: every N
        gradient steps instead (PPO's minibatch steps; TD3's critic steps, its delayed actor steps
        not counted: :data:`~rl_moe.regularizers.hooks.GRADIENT_STEP_PHASES`)
    :param target: ``actor``, ``critic`` or ``both``
    :param seed: seed of the fresh weights
    """

    layers: int = 1
    gate: bool = False
    every_updates: int = 0
    target: str = "actor"
    seed: int = 0

    def __post_init__(self) -> None:
        check_target(self.target)
        if self.layers < 1:
            raise ValueError(f"reset layers must be >= 1, got {self.layers}")
        if self.every_updates < 0:
            raise ValueError(f"reset every_updates must be >= 0, got {self.every_updates}")


def _orthogonal(like: Tensor, gain: float, gen: torch.Generator) -> Tensor:
    """A tensor shaped ``like`` whose trailing matrices are orthogonal with ``gain`` (CPU draw)."""
    fresh = torch.empty(like.shape, dtype=like.dtype)
    for m in fresh.view(-1, *like.shape[-2:]):
        nn.init.orthogonal_(m, gain=gain, generator=gen)
    return fresh.to(like.device)


def _fresh_values(net: nn.Module, layers: int, gate: bool, gen: torch.Generator) -> list[tuple[str, Tensor]]:
    """(parameter name in ``net``, its fresh value) of every tensor a reset draws anew."""
    names = {id(p): n for n, p in net.named_parameters()}
    out: list[tuple[nn.Parameter, Tensor]] = []
    for stack in expert_stacks(net):
        n = stack.n_layers
        for layer in range(max(0, n - layers), n):
            gain = stack.out_gain if layer == n - 1 else ACTIVATION_GAINS[stack.activation]
            out += [(stack.weights[layer], _orthogonal(stack.weights[layer], gain, gen)), (stack.biases[layer], torch.zeros_like(stack.biases[layer]))]
            if stack.layer_norm and layer < n - 1:
                out += [(stack.ln_weights[layer], torch.ones_like(stack.ln_weights[layer])), (stack.ln_biases[layer], torch.zeros_like(stack.ln_biases[layer]))]
    router = net.gate_mlp() if gate and isinstance(net, MoENetwork) else None
    if router is not None:
        out += [(router.logits.weight, _orthogonal(router.logits.weight, 1.0, gen)), (router.logits.bias, torch.zeros_like(router.logits.bias))]
    return [(names[id(p)], value) for p, value in out]


class Reset(Targeted):
    """Reset the last layers of every expert (and optionally the gate's output) with their optimizer state, at each task boundary or every N updates (Nikishin et al., 2022)."""

    name = "reset"
    config_class = ResetConfig
    config: ResetConfig

    def __init__(self, config: ResetConfig | None = None, **overrides: Any) -> None:
        super().__init__(config, **overrides)
        self.resets = 0
        self.reset_params = 0
        self._updates = 0

    def on_task_start(self, algo: Any, task_index: int) -> None:
        if self.config.every_updates == 0 and task_index > 0:
            self.apply(algo.policy)

    def after_update(self, algo: Any, phase: str) -> None:
        if self.config.every_updates > 0 and phase in GRADIENT_STEP_PHASES:  # TD3's actor steps are not counted
            self._updates += 1
            if self._updates % self.config.every_updates == 0:
                self.apply(algo.policy)

    @torch.no_grad()
    def apply(self, policy: Any) -> None:
        """Draw the reset tensors of every target role afresh (module docstring), with their
        optimizer state, and copy them into the role's target networks."""
        gen = torch.Generator(device="cpu").manual_seed(self.config.seed * 1_000_003 + self.resets)
        roles = policy_roles(policy)
        count = 0
        for name in self.roles:
            role = roles[name]
            targets = role.targets or (None,) * len(role.networks)
            for net, target in zip(role.networks, targets):
                params = dict(net.named_parameters())
                twin = dict(target.named_parameters()) if target is not None else {}
                for key, value in _fresh_values(net, self.config.layers, self.config.gate, gen):
                    params[key].copy_(value)
                    if key in twin:
                        twin[key].copy_(value)
                    if role.optimizer is not None:
                        _reset_state(role.optimizer, params[key])
                    count += value.numel()
        self.resets += 1
        self.reset_params = count

    def logs(self) -> dict[str, float]:
        return {"reset_count": float(self.resets), "reset_params": float(self.reset_params)}

    def state_dict(self, policy: Any) -> dict[str, Any]:
        return {"resets": self.resets, "reset_params": self.reset_params, "updates": self._updates}

    def load_state_dict(self, state: dict[str, Any], policy: Any) -> None:
        self.resets, self.reset_params, self._updates = int(state["resets"]), int(state["reset_params"]), int(state["updates"])


def _reset_state(opt: torch.optim.Optimizer, param: Tensor) -> None:
    """``param``'s optimizer state back to a fresh one's: zeros in place (a captured CUDA graph
    keeps the same tensors)."""
    state = opt.state.get(param)
    for key in _STATE if state else ():
        if key in state and torch.is_tensor(state[key]):
            state[key].zero_()

"""Plasticity injection (Nikishin et al. 2023, "Deep reinforcement learning with plasticity
injection", NeurIPS, arXiv:2305.15555).

At each task boundary (from the second task on) every expert's head is frozen and a fresh
trainable head minus a frozen copy of it is added (:mod:`rl_moe.nn.inject`): the network's output
is unchanged at that moment, bit for bit, while the new head starts from a fresh initialization.

Choices the paper leaves open, as taken here: the head is each expert's last linear layer (one
layer; the torso is every other expert layer and the gate, which are not touched); on a MoE each
expert gets its own injected head and the gate none; on TD3 the target networks get the same
fresh head; gradients reach the torso through all heads (only head parameters are frozen); a new
head is drawn as the stack's head was (orthogonal, the head's gain, bias 0) from a generator
seeded by ``seed`` and the injection's number, so a resumed run injects the same head. Adam keeps
the state of the parameters it already had; the new heads start with a fresh one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from rl_moe.nn.inject import fresh_head, inject
from rl_moe.nn.specnorm import expert_stacks
from rl_moe.policies import policy_roles
from rl_moe.policies.structure import rebuild_optimizers
from rl_moe.regularizers.targets import Targeted, check_target


@dataclass(frozen=True)
class InjectionConfig:
    """Plasticity-injection settings.

    :param target: ``actor``, ``critic`` or ``both``: the roles whose expert heads are injected
    :param seed: seed of the fresh heads
    """

    target: str = "actor"
    seed: int = 0

    def __post_init__(self) -> None:
        check_target(self.target)


class PlasticityInjection(Targeted):
    """Plasticity injection: at each task boundary freeze every expert head and add a fresh one minus its frozen copy (Nikishin et al., 2023)."""

    name = "injection"
    config_class = InjectionConfig
    config: InjectionConfig

    def __init__(self, config: InjectionConfig | None = None, **overrides: Any) -> None:
        super().__init__(config, **overrides)
        self.injections = 0
        self.frozen_params = 0

    def on_task_start(self, algo: Any, task_index: int) -> None:
        if task_index > 0:
            self.apply(algo.policy)

    def apply(self, policy: Any) -> None:
        """Inject a fresh head into every expert stack of the target roles (and their targets),
        then rebuild the optimizers over the grown networks."""
        gen = torch.Generator(device="cpu").manual_seed(self.config.seed * 1_000_003 + self.injections)
        roles = policy_roles(policy)
        for name in self.roles:
            role = roles[name]
            targets = role.targets or (None,) * len(role.networks)
            for net, target in zip(role.networks, targets):
                twins = expert_stacks(target) if target is not None else [None] * len(expert_stacks(net))
                for stack, twin in zip(expert_stacks(net), twins):
                    weight, bias = fresh_head(stack, gen)
                    self.frozen_params += stack.weights[-1].numel() + stack.biases[-1].numel()
                    inject(stack, weight, bias)
                    if twin is not None:
                        inject(twin, weight, bias)
        rebuild_optimizers(policy)
        self.injections += 1

    def logs(self) -> dict[str, float]:
        return {"injection_count": float(self.injections), "injection_frozen_params": float(self.frozen_params)}

    def state_dict(self, policy: Any) -> dict[str, Any]:
        return {"injections": self.injections, "frozen_params": self.frozen_params}

    def load_state_dict(self, state: dict[str, Any], policy: Any) -> None:
        self.injections, self.frozen_params = int(state["injections"]), int(state["frozen_params"])

"""A policy whose networks change structure during a run (plasticity injection grows its heads).

Two rules, once for every structure-changing method:

- **The optimizers follow the parameters.** An SB3 policy keeps each optimizer on the module it
  steps (``policy.optimizer`` for PPO; ``actor.optimizer`` and ``critic.optimizer`` for TD3).
  :func:`rebuild_optimizers` makes each one anew over its module's parameters in module order,
  keeping the settings of its group and the state of every parameter it held; a parameter that no
  optimizer held joins the optimizer of the module it belongs to. The order depends only on the
  structure, so an optimizer state saved by a grown run loads into a network grown to match.
  Anything keyed on the optimizer object (the PPO update's clipping split and CUDA graphs) is
  rebuilt with it.
- **A load grows the network first.** :class:`GrowingPolicy` grows a freshly built policy to the
  structure a state dict describes (:func:`rl_moe.nn.inject.grow_to_state`) before loading it,
  and rebuilds the optimizers; task checkpoints, in-task checkpoints and ``load_checkpoint`` all
  go through ``load_state_dict``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from stable_baselines3.common.policies import BaseModel
from torch import nn

from rl_moe.nn.inject import grow_to_state


def _optimizer_owners(policy: nn.Module) -> list[BaseModel]:
    # SB3's layout: an optimizer is the ``optimizer`` attribute of the BaseModel it steps.
    return [m for m in policy.modules() if isinstance(m, BaseModel) and isinstance(m.__dict__.get("optimizer"), torch.optim.Optimizer)]


def rebuilt_optimizer(old: torch.optim.Optimizer, params: list[nn.Parameter]) -> torch.optim.Optimizer:
    """An optimizer of ``old``'s class and settings over ``params``, with ``old``'s state for the
    parameters it held (the same tensors: nothing is copied).

    An optimizer that holds more than its per-parameter state (TRAC: its tuners and an inner
    Adam) rebuilds itself (``rebuilt(params)``).

    :raises ValueError: if ``old`` has several parameter groups (no policy here builds one)
    """
    if hasattr(old, "rebuilt"):
        return old.rebuilt(params)
    if len(old.param_groups) != 1:
        raise ValueError(f"cannot rebuild an optimizer of {len(old.param_groups)} parameter groups; valid: 1")
    new = type(old)(params, **old.defaults)
    new.param_groups[0].update({k: v for k, v in old.param_groups[0].items() if k != "params"})
    for p in params:
        if p in old.state:
            new.state[p] = old.state[p]
    return new


def rebuild_optimizers(policy: nn.Module) -> None:
    """Every optimizer of ``policy`` anew over its module's current parameters (module docstring)."""
    owners = _optimizer_owners(policy)
    held = {id(p) for m in owners for g in m.optimizer.param_groups for p in g["params"]}
    for module in owners:
        own = {id(p) for g in module.optimizer.param_groups for p in g["params"]}
        params = [p for p in module.parameters() if id(p) in own or id(p) not in held]
        module.optimizer = rebuilt_optimizer(module.optimizer, params)
        held |= {id(p) for p in params}


class GrowingPolicy(nn.Module):
    """Mixin of the rl_moe policies: ``load_state_dict`` grows the networks to the state's
    structure first and then rebuilds the optimizers (module docstring)."""

    def load_state_dict(self, state_dict: Mapping[str, Any], strict: bool = True, assign: bool = False) -> Any:
        if grow_to_state(self, state_dict):
            rebuild_optimizers(self)
        return super().load_state_dict(state_dict, strict=strict, assign=assign)

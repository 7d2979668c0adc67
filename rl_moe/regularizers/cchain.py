"""C-CHAIN: continual churn approximated reduction (Tang et al. 2025, "Mitigating plasticity loss in
continual RL by reducing churn", ICML).

Adds c * MSE(f_theta(x), f_prev(x)), f_prev the network as it was before the previous minibatch
update, on the current minibatch. c is set per update to 0.05 * mean|L_pg| / mean L_reg over the
last 100 updates (c = 100 during the first 50); L_pg is the PPO policy loss or TD3 actor loss
(critic target: the critic loss).

Choices: f is the network's raw output (actor mean before any tanh; critic value or Q), the
reference batch is the training minibatch itself (its forward is already computed), and the
snapshot network is run on the exact input of that forward, captured by a forward pre-hook. The
term is zero before the first update (no snapshot yet). Needs rl_moe networks (``MoEOutput``;
the dense ``mlp`` kind included); plain SB3 networks get no term.
"""

from __future__ import annotations

import copy
from collections import deque
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from rl_moe.regularizers.hooks import LossContext, Penalty
from rl_moe.policies import policy_roles
from rl_moe.regularizers.targets import Targeted, active_roles, check_target, module_names, term_name


class _Snapshot:
    """The previous parameters of one network, a frozen copy, and the last input it saw."""

    def __init__(self, net: nn.Module) -> None:
        self.net = net
        # Copied before the hook is registered, so running the copy does not overwrite the capture.
        self.copy = copy.deepcopy(net).requires_grad_(False)
        self.ready = False
        self.pending: list[Tensor] | None = None
        self.last_input: Tensor | None = None
        net.register_forward_pre_hook(self._capture)

    def _capture(self, _module: nn.Module, args: tuple[Any, ...]) -> None:
        self.last_input = args[0].detach() if args else None

    @torch.no_grad()
    def hold_current(self) -> None:
        """Copy the parameters about to be updated (they become the snapshot after the step)."""
        self.pending = [p.detach().clone() for p in self.net.parameters()]

    @torch.no_grad()
    def commit(self) -> None:
        if self.pending is None:
            return
        for dst, src in zip(self.copy.parameters(), self.pending):
            dst.copy_(src)
        self.pending, self.ready = None, True


@dataclass(frozen=True)
class CChainConfig:
    """C-CHAIN settings.

    :param target_ratio: the target ratio of the churn term to the policy loss
    :param initial_coef: c during warm-up
    :param warmup: updates using ``initial_coef``
    :param window: updates in the running means
    :param target: ``actor``, ``critic`` or ``both``
    """

    target_ratio: float = 0.05
    initial_coef: float = 100.0
    warmup: int = 50
    window: int = 100
    target: str = "actor"

    def __post_init__(self) -> None:
        if self.warmup < 0:
            raise ValueError(f"warmup must be >= 0, got {self.warmup}")
        if self.window < 1:
            raise ValueError(f"window must be >= 1, got {self.window}")
        check_target(self.target)


class CChain(Targeted):
    """Churn reduction towards the previous-update network."""

    name = "cchain"
    config_class = CChainConfig
    config: CChainConfig

    def __init__(self, config: CChainConfig | None = None, **overrides: Any) -> None:
        super().__init__(config, **overrides)
        window = self.config.window
        self._snaps: dict[int, _Snapshot] = {}
        self._pg: dict[str, deque[float]] = {r: deque(maxlen=window) for r in self.roles}
        self._reg: dict[str, deque[float]] = {r: deque(maxlen=window) for r in self.roles}
        self._held: dict[str, list[_Snapshot]] = {}

    def _snapshot(self, net: nn.Module) -> _Snapshot:
        if id(net) not in self._snaps:
            self._snaps[id(net)] = _Snapshot(net)
        return self._snaps[id(net)]

    def on_training_start(self, algo: Any) -> None:
        roles = policy_roles(algo.policy)
        for role in self.roles:
            for net in roles[role].networks:
                self._snapshot(net)  # hooks must exist before the first training forward

    def coefficient(self, role: str) -> float:
        pg, reg = self._pg[role], self._reg[role]
        cfg = self.config
        if len(pg) < cfg.warmup or sum(reg) <= 0:
            return cfg.initial_coef
        return cfg.target_ratio * (sum(abs(v) for v in pg) / len(pg)) / (sum(reg) / len(reg))

    def penalty(self, ctx: LossContext) -> list[Penalty]:
        terms = []
        for step in ctx.active(self.roles):
            role = step.role.name
            pairs = step.pairs()
            if not pairs:  # needs networks returning MoEOutput (rl_moe networks, dense ones included)
                continue
            snaps = [self._snapshot(n) for n, _ in pairs]
            losses = []
            for snap, (_, out) in zip(snaps, pairs):
                if snap.ready and snap.last_input is not None:
                    with torch.no_grad():
                        prev = snap.copy(snap.last_input).out
                    losses.append(F.mse_loss(out.out, prev))
            # L_pg: PPO's policy loss without the entropy term; otherwise the role's loss.
            ref = ctx.losses["policy"] if (ctx.phase, role) == ("ppo", "actor") else step.reference
            loss = torch.stack(losses).sum() if losses else ref.new_zeros(())
            coef = self.coefficient(role)
            if losses:
                self._pg[role].append(float(ref.detach()))
                self._reg[role].append(float(loss.detach()))
            for snap in snaps:
                snap.hold_current()
            self._held[role] = snaps
            terms.append(Penalty(term_name(self.name, self.roles, role), loss, coef))
        return terms

    def after_update(self, algo: Any, phase: str) -> None:
        for role in active_roles(phase, self.roles):
            for snap in self._held.pop(role, []):
                snap.commit()

    def state_dict(self, policy: Any) -> dict[str, Any]:
        names = module_names(policy)
        snaps = {
            names[id(s.net)]: {"ready": s.ready, "params": [p.detach().clone() for p in s.copy.parameters()]}
            for s in self._snaps.values()
        }
        return {"snapshots": snaps, "pg": {r: list(v) for r, v in self._pg.items()}, "reg": {r: list(v) for r, v in self._reg.items()}}

    @torch.no_grad()
    def load_state_dict(self, state: dict[str, Any], policy: Any) -> None:
        modules = dict(policy.named_modules())
        for name, saved in state["snapshots"].items():
            snap = self._snapshot(modules[name])
            for dst, src in zip(snap.copy.parameters(), saved["params"], strict=True):
                dst.copy_(src)
            snap.ready, snap.pending = bool(saved["ready"]), None
        for key, store in (("pg", self._pg), ("reg", self._reg)):
            for role, values in state[key].items():
                store[role].clear()
                store[role].extend(float(v) for v in values)

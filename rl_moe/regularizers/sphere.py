"""SPHERE: Spectral Plasticity via Hyperspherical Expert REgularization (SPHERE paper, Eq. 26-27).

L_SPHERE = ||A||_F^2 - tr(A)^2 / m, A = Phi^T Phi / N, where Phi (N, m) concatenates the
routing-weighted last-hidden expert features (m = sum over expert stacks of E * H). The penalty is
zero exactly when A is a multiple of I. It is computed in sample space from routed rows only
(:mod:`rl_moe.regularizers.gram`) unless m <= N. A dense MLP is the E=1 case.

Coefficient (App. A.3), per minibatch:
- ``adaptive`` (default): lambda = rho * stopgrad(||grad_theta L_ref|| / (||grad_theta L_SPHERE|| + eps))
  over the regularized network's parameters (experts and gate), L_ref = the actor loss (PPO policy
  + entropy term; TD3 actor loss) or, for a critic placement, the critic loss (PPO value loss,
  TD3 critic loss). Costs one extra backward of the penalty through that network per minibatch
  (the learner reuses the reference loss's gradient for its norm).
- ``fixed``: lambda = rho.
- ``loss_ratio``: lambda = rho * |L_ref| / L_SPHERE.
A negative rho is the sign-flip intervention (Table 21): it rewards anisotropy.
"""

from __future__ import annotations

import sys

from collections.abc import Callable
from functools import partial
from typing import Any

import torch
from torch import Tensor, nn

from rl_moe.regularizers.hooks import GradScale, LossContext, Penalty, Regularizer, RoleStep, clamp_coef
from rl_moe.maths import effective_rank
from rl_moe.nn import MoEOutput
from rl_moe.regularizers.gram import FeatureBlock, GramStats, gram_stats, per_expert_stats
from rl_moe.regularizers.options import build_config
from rl_moe.regularizers.sphere_config import SphereConfig
from rl_moe.regularizers.targets import TARGETS, term_name


def sphere_value(stats: GramStats, alpha: float | None = None, scale_invariant: bool = False) -> Tensor:
    """||A||_F^2 - tr(A)^2 / m, or ||A - alpha I||_F^2 = ||A||^2 - 2 alpha tr(A) + alpha^2 m; with
    ``scale_invariant``, (||A||_F^2 - tr(A)^2 / m) / tr(A)^2 (0 for a zero Gram)."""
    if alpha is not None:
        return stats.fro2 - 2 * alpha * stats.trace + alpha**2 * stats.dim
    value = stats.fro2 - stats.trace.pow(2) / stats.dim
    if not scale_invariant:
        return value
    tr2 = stats.trace.pow(2)
    # An idle expert's zero Gram has no shape to penalise: 0, not 0/0 (and no NaN gradient).
    return torch.where(tr2 > 0, value / tr2.clamp_min(torch.finfo(tr2.dtype).tiny), torch.zeros_like(value))


#: An update is *collapsed* when SPHERE's coefficient lambda (the update's mean) exceeds
#: COLLAPSE_COEF or its penalty falls below COLLAPSE_LOSS: the penalty ||A||^2 - tr(A)^2/m is then
#: driving the regularized features toward zero (docs/results.md, "Definitions"). Logged per update
#: as ``train/sphere_collapsed``.
COLLAPSE_COEF = 1e4
COLLAPSE_LOSS = 1e-8


def is_collapsed(coef: float, loss: float) -> bool:
    """Whether an update with mean lambda ``coef`` and mean penalty ``loss`` is collapsed."""
    return abs(coef) > COLLAPSE_COEF or loss < COLLAPSE_LOSS


def feature_blocks(out: MoEOutput, layers: tuple[int, ...], weighted: bool) -> list[FeatureBlock]:
    """One block per expert stack; several layers are concatenated along the feature axis."""
    blocks = []
    for g in out.groups:
        hs = [g.expert.hidden[i] for i in layers]
        feats = hs[0] if len(hs) == 1 else torch.cat(hs, dim=1)  # (R, sum H)
        blocks.append(FeatureBlock(g.dispatch, feats, g.dispatch.row_scale(weighted)))
    return blocks


def _coef_fixed(rho: float, ref: Tensor, loss: Tensor, eps: float) -> float:
    return float(rho)


def _coef_loss_ratio(rho: float, ref: Tensor, loss: Tensor, eps: float) -> Tensor:
    loss = loss.detach()
    # A zero penalty gets coefficient 0 rather than rho * |ref| / eps.
    return torch.where(loss > 0, rho * ref.detach().abs() / (loss + eps), torch.zeros_like(loss))  # () tensor: no host read


#: Coefficient rules computed from the losses alone: coef_mode -> (rho, reference, penalty, eps) -> lambda.
#: ``adaptive`` needs gradient norms: per minibatch the learner resolves a :class:`GradScale`;
#: with ``ratio_every > 1`` the ratio is computed directly and reused.
LOSS_COEF_RULES: dict[str, Callable[[float, Tensor, Tensor, float], float | Tensor]] = {
    "fixed": _coef_fixed,
    "loss_ratio": _coef_loss_ratio,
}


def gate_loss(probs: Tensor) -> Tensor:
    """(||G||_F^2 - tr(G)^2 / E) / E with G = P^T P / N for routing weights ``probs`` (N, E): 0 when
    the states spread evenly and one-hot over the experts (G = I / E), (1 - 1/E) / E when every
    state goes to one expert (the SPHERE authors' ``sphere_output_loss``)."""
    n, e = probs.shape
    g = probs.T @ probs / n  # (E, E)
    return ((g * g).sum() - torch.trace(g) ** 2 / e) / e


class Sphere(Regularizer):
    """The SPHERE penalty as a learner hook.

    ``Sphere()`` is the paper's MetaWorld setup; keyword arguments override :class:`SphereConfig`
    fields, e.g. ``Sphere(placement="critic")`` or ``Sphere(rho=1e-3)`` (HumanoidBench, Table 2).

    :param config: full configuration (``overrides`` are applied on top when given)
    """

    name = "sphere"
    config_class = SphereConfig

    def __init__(self, config: SphereConfig | None = None, **overrides: Any) -> None:
        self.config = build_config(SphereConfig, config, overrides, "SPHERE")
        self.roles = TARGETS[self.config.placement]
        self._calls = 0
        self._last: dict[str, float] = {}
        self._ratios: dict[str, float | Tensor] = {}
        self._high_updates = 0  # updates in a row with lambda above warn_coef
        self._sync_free = False
        self._last_gram: Tensor | None = None  # the sync-free path's latest A_last Gram, ranked in logs()
        self._last_trace: Tensor | None = None  # tr(A_last) of the latest call, read once per update in logs()
        self._trace0: float | None = None  # tr(A_last) of the fresh network: the run's first minibatch, before any step
        self._fresh: Tensor | None = None  # that value on the device until logs() reads it

    @property
    def graph_safe(self) -> bool:
        """Sync-free except when the ratio is reused across minibatches (``ratio_every > 1``
        counts calls in Python) or per-expert penalties use a fixed target (idle experts would
        need the routed counts on the host)."""
        cfg = self.config
        return (cfg.ratio_every == 1 or cfg.coef_mode != "adaptive") and not (cfg.per_expert and cfg.alpha is not None)

    def penalty(self, ctx: LossContext) -> list[Penalty]:
        cfg = self.config
        self._sync_free = ctx.sync_free
        terms = []
        for step in ctx.active(self.roles):
            role = step.role.name
            pairs = step.pairs()
            if not pairs:
                continue
            ref = step.reference
            loss = sum((self.network_loss(out, ref) for _, out in pairs), start=ref.new_zeros(()))
            if cfg.rho != 0 and cfg.coef_mode == "adaptive" and self._refresh(role):
                # The learner resolves the ratio while backpropagating (one backward fewer than
                # computing both norms here) and hands it back for the minibatches in between.
                scale = GradScale(
                    cfg.rho, ref, self._theta(ctx, step), cfg.eps, on_resolve=partial(self._store_ratio, role),
                    ceiling=cfg.max_coef, pcgrad=cfg.pcgrad, norm_eps=cfg.norm_eps,
                )  # fmt: skip
                terms.append(Penalty(term_name(self.name, self.roles, role), loss, 0.0, scale))
                continue
            coef = 0.0 if cfg.rho == 0 else self._coefficient(role, ref, loss)
            terms.append(Penalty(term_name(self.name, self.roles, role), loss, coef))
        if cfg.gating_ratio > 0:
            terms.extend(self._gate_terms(ctx))
        self._calls += 1
        return terms

    def _gate_terms(self, ctx: LossContext) -> list[Penalty]:
        """The routing-weight term of each active role (``gating_ratio``)."""
        cfg = self.config
        terms = []
        for step in ctx.active(self.roles):
            pairs = step.pairs()
            if not pairs:
                continue
            ref = step.reference
            loss = sum((gate_loss(out.probs) for _, out in pairs), start=ref.new_zeros(()))
            name = f"{term_name(self.name, self.roles, step.role.name)}_gate"
            if cfg.coef_mode == "adaptive":
                terms.append(Penalty(name, loss, 0.0, GradScale(cfg.gating_ratio, ref, self._theta(ctx, step), cfg.eps, norm_eps=cfg.norm_eps)))
            else:
                terms.append(Penalty(name, loss, LOSS_COEF_RULES[cfg.coef_mode](cfg.gating_ratio, ref, loss, cfg.eps)))
        return terms

    def _theta(self, ctx: LossContext, step: RoleStep) -> tuple[nn.Parameter, ...]:
        """The parameters whose gradient norms set an adaptive lambda: the role's networks, plus
        the PPO actor's log-std under ``log_std_in_theta`` (the authors' whole actor tree)."""
        log_std = getattr(ctx.algo.policy, "log_std", None)
        if self.config.log_std_in_theta and step.role.name == "actor" and isinstance(log_std, nn.Parameter):
            return (*step.params, log_std)
        return step.params

    def _refresh(self, role: str) -> bool:
        """Whether the gradient-norm ratio of ``role`` is due (every ``ratio_every`` calls)."""
        return self.config.ratio_every == 1 or role not in self._ratios or self._calls % self.config.ratio_every == 0

    def _store_ratio(self, role: str, coef: Tensor) -> None:
        self._ratios[role] = coef / self.config.rho

    def _coefficient(self, role: str, ref: Tensor, loss: Tensor) -> float | Tensor:
        cfg = self.config
        if cfg.coef_mode == "adaptive":  # between refreshes: the last resolved ratio
            coef: float | Tensor = cfg.rho * self._ratios[role]
        else:
            coef = LOSS_COEF_RULES[cfg.coef_mode](cfg.rho, ref, loss, cfg.eps)
        return clamp_coef(coef, cfg.max_coef)

    def network_loss(self, out: MoEOutput, reference: Tensor | None = None) -> Tensor:
        """L_SPHERE of one network output (``reference`` is needed for the gradient Gram)."""
        cfg = self.config
        loss = out.out.new_zeros(())
        if cfg.gram in ("features", "both"):
            loss = loss + self._feature_loss(out)
        if cfg.gram in ("gradients", "both"):
            if reference is None:
                raise ValueError(f"gram={cfg.gram!r} needs the reference loss (the actor or critic loss); got reference=None")
            loss = loss + self._gradient_loss(out, reference)
        return loss

    def _feature_loss(self, out: MoEOutput) -> Tensor:
        cfg = self.config
        n_hidden = len(out.groups[0].expert.hidden)
        layer_sets = {"last": [(n_hidden - 1,)], "all": [(i,) for i in range(n_hidden)], "joint": [tuple(range(n_hidden))]}
        weighted = cfg.features == "weighted"
        loss = out.out.new_zeros(())
        for layers in layer_sets[cfg.layer]:
            loss = loss + self._blocks_loss(feature_blocks(out, layers, weighted), log_rank=layers == (n_hidden - 1,))
        return loss

    def _gradient_loss(self, out: MoEOutput, reference: Tensor) -> Tensor:
        """SPHERE on G_last = Psi^T Psi / N, Psi's rows the per-sample backprop vectors.

        Per-sample gradients come from one autograd.grad of the batch-mean loss (samples are
        independent given the routing), rescaled by N; create_graph=True makes the penalty
        differentiable. The routing weight is already inside these vectors, so no extra scale.
        """
        sites = [g.expert.pre[-1] if self.config.grad_site == "hidden" else g.expert.linear[-1] for g in out.groups]
        grads = torch.autograd.grad(reference, sites, create_graph=True, retain_graph=True, allow_unused=True)
        n = out.out.shape[0]
        blocks = [
            FeatureBlock(g.dispatch, gr * n if gr is not None else torch.zeros_like(s), None)
            for g, gr, s in zip(out.groups, grads, sites)
        ]
        return self._blocks_loss(blocks, log_rank=False)

    def _blocks_loss(self, blocks: list[FeatureBlock], log_rank: bool) -> Tensor:
        cfg = self.config
        if cfg.per_expert:
            stats_per_stack = per_expert_stats(blocks)
            return sum((sphere_value(s, cfg.alpha, cfg.scale_invariant).sum() for s in stats_per_stack), start=blocks[0].feats.new_zeros(()))
        stats = gram_stats(blocks, cfg.space)
        if log_rank:
            self._last_trace = stats.trace.detach()
            if self._trace0 is None and self._fresh is None:  # the first call: the features before any update
                self._fresh = self._last_trace.clone()
        if log_rank and cfg.rank_every:
            if self._sync_free:  # an eigvalsh reads the device: rank the latest Gram once per update
                self._last_gram = stats.gram.detach()
            elif self._calls % cfg.rank_every == 0:
                self._last["sphere_feature_rank"] = effective_rank(stats.gram)
        return sphere_value(stats, cfg.alpha, cfg.scale_invariant)

    def logs(self) -> dict[str, float]:
        """``sphere_feature_rank``: r_e(A_last) at the latest sampled call (loss and lambda are
        logged by the learner as ``train/loss_sphere`` and ``train/coef_sphere``). Once per update
        (a host read there costs nothing) it also watches lambda for the collapse warning."""
        if self._last_gram is not None:
            self._last["sphere_feature_rank"] = effective_rank(self._last_gram)
        if self._last_trace is not None:
            trace = float(self._last_trace)
            if self._trace0 is None and self._fresh is not None:
                self._trace0, self._fresh = float(self._fresh), None
            self._last["sphere_trace"] = trace
            self._last["sphere_trace_ratio"] = trace / self._trace0 if self._trace0 else float("nan")
        return dict(self._last)

    def logged(self, values: dict[str, float]) -> None:
        """One line on stderr when lambda (the update's mean ``train/coef_sphere*``, gate term
        aside) has stayed above ``warn_coef`` for ``warn_updates`` updates in a row."""
        cfg = self.config
        coefs = [abs(v) for k, v in values.items() if k.startswith(f"train/coef_{self.name}") and not k.endswith("_gate")]
        losses = [v for k, v in values.items() if k.startswith(f"train/loss_{self.name}") and not k.endswith("_gate")]
        if losses:
            self._last["sphere_collapsed"] = float(is_collapsed(max(coefs, default=0.0), min(losses)))
        if not coefs:
            return
        coef = max(coefs)
        self._high_updates = self._high_updates + 1 if coef > cfg.warn_coef else 0
        if self._high_updates == cfg.warn_updates:
            print(
                f"warning: SPHERE's lambda has stayed above {cfg.warn_coef:g} for {cfg.warn_updates} updates (now {coef:.3g}): the actor's "
                "features are likely collapsing on a task it does not solve; see docs/regularizers.md, \"SPHERE's scale on MetaWorld\" "
                "(reg.sphere.max_coef, reg.sphere.scale_invariant=true)", file=sys.stderr,
            )  # fmt: skip

    def state_dict(self, policy: Any) -> dict[str, Any]:
        # The call count drives rank_every and ratio_every; the ratios are reused in between; the
        # last logged rank is logged again until the next sampled call, resumed or not.
        return {
            "calls": self._calls, "ratios": {k: float(v) for k, v in self._ratios.items()},
            "last": {k: float(v) for k, v in self._last.items()}, "trace0": self._trace0,
        }  # fmt: skip

    def load_state_dict(self, state: dict[str, Any], policy: Any) -> None:
        self._calls = int(state["calls"])
        self._ratios = {str(k): float(v) for k, v in state["ratios"].items()}
        self._last = {str(k): float(v) for k, v in state.get("last", {}).items()}
        self._trace0 = None if state.get("trace0") is None else float(state["trace0"])

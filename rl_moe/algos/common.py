"""Machinery shared by the regularized learners: collecting, summing and logging penalty terms."""

from __future__ import annotations

from collections import defaultdict
from typing import Any, Iterable, Protocol, Sequence

import numpy as np
import torch
from torch import Tensor, nn

from rl_moe.algos.guard import check_update
from rl_moe.algos.hooks import LossContext, Penalty, Regularizer, adaptive_coef, grads_norm


class TermSink(Protocol):
    """Where the learner logs each penalty term of a minibatch (loss and coefficient)."""

    def add(self, name: str, loss: Tensor, coef: Tensor | float) -> None: ...


class HostTermLog:
    """Per-minibatch floats, averaged per update (one host read per term and minibatch)."""

    def __init__(self) -> None:
        self.values: dict[str, list[float]] = defaultdict(list)

    def add(self, name: str, loss: Tensor, coef: Tensor | float) -> None:
        self.values[f"train/loss_{name}"].append(float(loss.detach()))
        self.values[f"train/coef_{name}"].append(float(coef))

    def means(self) -> dict[str, float]:
        out = {key: float(np.mean(v)) for key, v in self.values.items()}
        self.values.clear()
        return out


class DeviceTermLog:
    """Running sums kept on the device (no host sync per minibatch), read once per update.

    The sums are updated in place, so a CUDA graph captured around :meth:`add` keeps adding into
    the same tensors on every replay; such a caller counts the minibatches itself. Eager callers
    can rely on the per-term counts (TD3's two phases add their terms different numbers of times).
    """

    def __init__(self) -> None:
        self.sums: dict[str, Tensor] = {}
        self.counts: dict[str, int] = defaultdict(int)

    def add(self, name: str, loss: Tensor, coef: Tensor | float) -> None:
        for key, value in ((f"train/loss_{name}", loss), (f"train/coef_{name}", coef)):
            # A fill kernel, not a host-to-device copy (which a CUDA graph capture refuses).
            value = value.detach() if isinstance(value, Tensor) else loss.new_full((), float(value))
            if key not in self.sums:
                self.sums[key] = torch.zeros((), dtype=loss.dtype, device=loss.device)
            self.sums[key].add_(value)
            self.counts[key] += 1

    def zero_(self) -> None:
        for t in self.sums.values():
            t.zero_()
        self.counts.clear()

    def means(self, count: int | None = None) -> dict[str, float]:
        """Mean of each term over ``count`` additions (None: the additions :meth:`add` saw)."""
        if not self.sums or count == 0:
            return {}
        values = torch.stack(list(self.sums.values())).cpu().tolist()  # the one read per update
        return {key: v / (max(self.counts[key], 1) if count is None else count) for key, v in zip(self.sums, values)}


class RegularizedMixin:
    """Adds a list of :class:`Regularizer` objects to an SB3 algorithm.

    The penalties of one phase are summed in :meth:`_backward`, the only place where extra
    loss terms enter an update; each term's loss and coefficient are logged as
    ``train/loss_<name>`` and ``train/coef_<name>`` (means over the update's minibatches).
    """

    regularizers: list[Regularizer]

    def _init_regularizers(self, regularizers: Sequence[Regularizer]) -> None:
        self.regularizers = list(regularizers)
        self._penalty_log = HostTermLog()

    def _excluded_save_params(self) -> list[str]:
        # Regularizers hold references into the policy and are rebuilt by the caller on load.
        return [*super()._excluded_save_params(), "regularizers", "_penalty_log"]  # type: ignore[misc]

    def _setup_model(self) -> None:
        super()._setup_model()  # type: ignore[misc]
        for reg in self.regularizers:
            reg.on_training_start(self)  # type: ignore[arg-type]

    def flush_update_logs(self) -> None:
        """Write the last update's pending ``train/*`` values at the current step; each learner
        defines when SB3 would otherwise leave them unwritten."""
        raise NotImplementedError

    def start_task(self, task_index: int) -> None:
        """Notify every regularizer that task ``task_index`` begins (continual scheduler hook)."""
        for reg in self.regularizers:
            reg.on_task_start(self, task_index)  # type: ignore[arg-type]

    def _backward(
        self, ctx: LossContext, reference: Tensor, rest: Tensor, params: Iterable[nn.Parameter], sink: TermSink | None = None
    ) -> Tensor:
        """Backpropagate ``reference + rest + sum(coef * penalty)`` into ``.grad``; return the total.

        Every regularizer first observes ``ctx``, then returns its penalties. This is the one place where extra loss terms enter an update. ``reference`` is the loss
        adaptive coefficients compare against (PPO: the actor loss; TD3: the phase's loss) and
        ``rest`` the other base terms. A :class:`GradScale` term is resolved here: the gradient of
        ``reference`` is computed once, used both for its norm and as the update, and the
        penalty's gradient is scaled and added, so an adaptive term costs one extra backward of
        the penalty only. Coefficients stay tensors, so nothing here reads the device unless
        ``sink`` does (the default sink, :class:`HostTermLog`, reads each term once).
        """
        sink = self._penalty_log if sink is None else sink
        for reg in self.regularizers:
            reg.observe(ctx)
        scaled: list[Penalty] = []
        for reg in self.regularizers:
            for term in reg.penalty(ctx):
                if term.scale is not None and term.scale.rho != 0.0:
                    scaled.append(term)
                    continue
                coef = 0.0 if term.scale is not None else term.coef
                sink.add(term.name, term.loss, coef)
                # Skipping zero coefficients keeps rho=0 runs bit-identical to unregularized ones.
                if isinstance(coef, Tensor) or coef != 0.0:
                    rest = rest + coef * term.loss
        if not scaled:
            total = reference + rest
            total.backward()
            return total.detach()
        return self._backward_scaled(reference, rest, scaled, [p for p in params if p.requires_grad], sink)

    def _backward_scaled(
        self, reference: Tensor, rest: Tensor, scaled: list[Penalty], params: list[nn.Parameter], sink: TermSink
    ) -> Tensor:
        grads = list(torch.autograd.grad(reference, params, retain_graph=True, allow_unused=True))
        index = {id(p): i for i, p in enumerate(params)}
        total = reference.detach() + rest.detach()
        updates: list[tuple[Tensor, tuple[Tensor | None, ...]]] = []
        keep: list[tuple[Tensor, list[int]]] = []  # PCGrad: (share of the reference gradient removed, its indices)
        for term in scaled:  # every norm is taken before ``grads`` is updated in place below
            s = term.scale
            assert s is not None
            sel = [index[id(p)] for p in s.params if id(p) in index]
            pen = torch.autograd.grad(term.loss, params, retain_graph=True, allow_unused=True)
            if s.reference is reference:
                ref_norm = grads_norm(grads[i] for i in sel)
            else:
                ref_norm = grads_norm(torch.autograd.grad(s.reference, [params[i] for i in sel], retain_graph=True, allow_unused=True))
            coef = adaptive_coef(s.rho, ref_norm, grads_norm(pen[i] for i in sel), s.eps)  # () tensor
            if s.ceiling is not None:
                coef = coef.clamp(-s.ceiling, s.ceiling)
            if s.pcgrad and s.reference is reference:
                pairs = [(pen[i], grads[i]) for i in sel if pen[i] is not None and grads[i] is not None]
                dot = coef * sum(((a * b).sum() for a, b in pairs), start=coef.new_zeros(()))
                share = torch.where(dot < 0, dot / (ref_norm**2 + s.eps), torch.zeros_like(dot)).detach()
                keep.append((share, sel))
            if s.on_resolve is not None:
                s.on_resolve(coef)
            sink.add(term.name, term.loss, coef)
            updates.append((coef, pen))
            total = total + coef * term.loss.detach()
        # PCGrad: the penalty's opposing component along g_ref comes off as share * g_ref.
        for share, sel in keep:
            for i in sel:
                if grads[i] is not None:
                    grads[i] = grads[i].mul(1.0 - share)
        # In place: with many experts these are the largest tensors of the update.
        for coef, pen in updates:
            for i, g in enumerate(pen):
                if g is not None:
                    grads[i] = g.mul_(coef) if grads[i] is None else grads[i].addcmul_(g, coef)
        if rest.requires_grad:
            rest.backward()
        for p, g in zip(params, grads):
            if g is not None:
                p.grad = g if p.grad is None else p.grad.add_(g)
        return total

    def _regularizer_keys(self) -> list[str]:
        return [f"{i}:{reg.name}" for i, reg in enumerate(self.regularizers)]

    def regularizer_state(self) -> dict[str, Any]:
        """Every regularizer's internal state (CBP utilities, the C-CHAIN snapshot, counters),
        keyed by position and name; saved next to each checkpoint so a resume continues exactly."""
        policy: Any = self.policy  # type: ignore[attr-defined]
        return {key: reg.state_dict(policy) for key, reg in zip(self._regularizer_keys(), self.regularizers)}

    def load_regularizer_state(self, state: dict[str, Any]) -> None:
        """Restore :meth:`regularizer_state` into this learner's (freshly built) regularizers.

        :raises ValueError: if ``state`` belongs to a different list of regularizers
        """
        keys = self._regularizer_keys()
        if sorted(state) != sorted(keys):
            raise ValueError(f"regularizer state holds {sorted(state)}, but this learner has {keys}")
        policy: Any = self.policy  # type: ignore[attr-defined]
        for key, reg in zip(keys, self.regularizers):
            reg.load_state_dict(state[key], policy)

    def _after_update(self, phase: str) -> None:
        for reg in self.regularizers:
            reg.after_update(self, phase)  # type: ignore[arg-type]

    def _record_regularizer_logs(self, term_means: dict[str, float] | None = None) -> None:
        """Log the penalty terms (means over the update) and each regularizer's own scalars, then
        run the NaN guard on everything the update logged (every update path ends here).

        :raises NonFiniteError: if a logged ``train/*`` value, a weight or a gradient is not finite
        """
        logger: Any = self.logger  # type: ignore[attr-defined]
        means = self._penalty_log.means() if term_means is None else term_means
        for key, value in means.items():
            logger.record(key, value)
        for reg in self.regularizers:
            reg.logged(means)
        for reg in self.regularizers:
            for key, value in reg.logs().items():
                logger.record(f"train/{key}", value)
        check_update(logger.name_to_value, self.policy.parameters())  # type: ignore[attr-defined]

"""Sample-space Gram kernels behind :func:`rl_moe.regularizers.gram.gram_stats` (SPHERE App. A.2).

G = Phi Phi^T / N is built expert by expert over routed rows only. The rows of an expert are a
contiguous slice of the dispatch, so with few active experts each expert's (C, C) product is one
matmul on its slice, scattered into G with one ``index_add`` (:class:`_LoopGram`). With many
experts the per-call cost dominates: experts of similar load are grouped into buckets, each
bucket's rows are padded into a (B, C, H) block (one gather for all buckets), multiplied with one
``bmm`` per bucket and scattered into G with one ``scatter_add`` for all buckets; there the routing
weights multiply the (C, C) products rather than the (C, H) features (:class:`_SampleGram`). Both
backward passes are written by hand (one matmul per expert or bucket instead of two).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from rl_moe.nn import Dispatch

from rl_moe.regularizers.blocks import FeatureBlock

#: Fixed cost of one more bucket (two bmm calls), in multiply-adds; tuned on CPU at E=10 and E=160.
_BUCKET_COST = 0.5e6
_MAX_LEVELS = 48
#: Up to this many active experts one matmul per expert beats padded buckets (CPU, N=256: 1.3x
#: faster at E=10, even at E=64; buckets are 1.6x faster at E=160).
_LOOP_MAX_EXPERTS = 48


def _is_full(d: Dispatch) -> bool:
    """Every sample goes to every expert, in sample order (Dense-MoE, Soft-MoE, shared, E=1)."""
    if not all(c == d.n_samples for c in d.counts):
        return False
    in_order = torch.arange(d.n_samples, device=d.sample_idx.device).repeat(d.n_experts)
    return bool(torch.equal(d.sample_idx, in_order))


def _buckets(counts: Sequence[int], width: int) -> list[list[int]]:
    """Experts grouped so that one padded bmm per group is cheapest overall.

    Experts sorted by load are cut into contiguous groups by a small dynamic program over the
    distinct loads (quantised to ~8% steps when there are many); a group costs its padded
    multiply-adds plus a fixed cost per bmm.
    """
    by_load: dict[int, list[int]] = {}
    for e, c in enumerate(counts):
        if c > 0:
            by_load.setdefault(c, []).append(e)
    loads = sorted(by_load)
    if len(loads) > _MAX_LEVELS:  # merge nearby loads so the program stays tiny
        merged: dict[int, list[tuple[int, int]]] = {}
        for c in loads:
            key = round(math.log(c) / math.log(1.08))
            merged.setdefault(key, []).extend((c, e) for e in by_load[c])
        levels = [sorted(v) for _, v in sorted(merged.items())]
        caps = [lv[-1][0] for lv in levels]
        members = [[e for _, e in lv] for lv in levels]
    else:
        caps, members = loads, [by_load[c] for c in loads]
    n_lv = len(caps)
    best = [0.0] + [float("inf")] * n_lv  # best[j]: cost of the first j levels
    cut = [0] * (n_lv + 1)
    for j in range(1, n_lv + 1):
        n_exp = 0
        for i in range(j - 1, -1, -1):
            n_exp += len(members[i])
            cost = best[i] + n_exp * caps[j - 1] ** 2 * width + _BUCKET_COST
            if cost < best[j]:
                best[j], cut[j] = cost, i
    groups, j = [], n_lv
    while j > 0:
        groups.append([e for lv in members[cut[j] : j] for e in lv])
        j = cut[j]
    return groups


class _Plan(NamedTuple):
    """Padded layout of one expert stack, all buckets laid end to end.

    Slot t of the padded rows holds feature row ``rows[t]``. Bucket k owns the slots
    ``[row_off[k], row_off[k+1])`` as a (B_k, C_k) grid and the products
    ``[prod_off[k], prod_off[k+1])`` as (B_k, C_k, C_k); product p lands in G at ``flat[p]`` (pads
    go to the spare slot N*N). A full dispatch needs no indices: ``flat`` is None and its only
    bucket is (E, N).
    """

    rows: Tensor  # (T,) long
    slot_of_row: Tensor  # (R,) long, the padded slot holding each feature row
    shapes: tuple[tuple[int, int], ...]  # (B_k, C_k) per bucket
    row_off: tuple[int, ...]
    prod_off: tuple[int, ...]
    flat: Tensor | None  # (P,) long


def _plan(d: Dispatch, width: int) -> _Plan:
    """Index plan of one expert stack, built in numpy (tiny integer arrays, no autograd)."""
    dev, n = d.sample_idx.device, d.n_samples
    if _is_full(d):
        total = d.n_experts * n
        rows = torch.arange(total, device=dev)
        return _Plan(rows, rows, ((d.n_experts, n),), (0, total), (0, d.n_experts * n * n), None)
    counts = np.asarray(d.counts)  # (E,)
    groups = _buckets(d.counts, width)
    shapes = [(len(g), int(counts[g].max())) for g in groups]
    row_off = np.cumsum([0] + [b * c for b, c in shapes])
    prod_off = np.cumsum([0] + [b * c * c for b, c in shapes])
    # Slot of expert e's first row: its bucket's offset + its place in the bucket * the bucket's cap.
    first_slot = np.zeros(len(counts), dtype=np.int64)
    for k, g in enumerate(groups):
        first_slot[g] = row_off[k] + np.arange(len(g)) * shapes[k][1]
    expert_of_row = np.repeat(np.arange(len(counts)), counts)  # (R,)
    local = np.arange(len(expert_of_row)) - (np.cumsum(counts) - counts)[expert_of_row]  # (R,)
    slot_of_row = first_slot[expert_of_row] + local  # (R,)
    rows = np.zeros(row_off[-1], dtype=np.int64)  # pads read row 0
    rows[slot_of_row] = np.arange(len(slot_of_row))
    sample = np.full(row_off[-1], -1, dtype=np.int64)  # -1 marks pads
    sample[slot_of_row] = d.sample_idx.detach().cpu().numpy()
    flat = np.empty(prod_off[-1], dtype=np.int64)
    for k, (n_b, cap) in enumerate(shapes):
        s_k = sample[row_off[k] : row_off[k + 1]].reshape(n_b, cap)
        f_k = s_k[:, :, None] * n + s_k[:, None, :]  # (B, C, C)
        f_k[(s_k[:, :, None] < 0) | (s_k[:, None, :] < 0)] = n * n
        flat[prod_off[k] : prod_off[k + 1]] = f_k.ravel()
    as_t = lambda a: torch.from_numpy(a).to(dev)
    return _Plan(
        as_t(rows), as_t(slot_of_row), tuple(shapes), tuple(int(o) for o in row_off), tuple(int(o) for o in prod_off), as_t(flat)
    )


def _bmm_buckets(plan: _Plan, a: Tensor, b: Tensor, out: Tensor, b_is_prod: bool) -> None:
    """One bmm per bucket, written into slices of ``out``.

    :param b_is_prod: False: ``a``, ``b`` are padded rows (T, H) and out_k = a_k b_k^T are products
        (P,); True: ``a`` holds products (P,), ``b`` rows (T, H), and out_k = a_k b_k are rows (T, H)
    """
    h = a.shape[-1] if not b_is_prod else b.shape[-1]
    for k, (n_b, cap) in enumerate(plan.shapes):
        r0, r1, p0, p1 = plan.row_off[k], plan.row_off[k + 1], plan.prod_off[k], plan.prod_off[k + 1]
        if b_is_prod:
            torch.bmm(a[p0:p1].view(n_b, cap, cap), b[r0:r1].view(n_b, cap, h), out=out[r0:r1].view(n_b, cap, h))
        else:
            rows = a[r0:r1].view(n_b, cap, h)
            torch.bmm(rows, b[r0:r1].view(n_b, cap, h).transpose(1, 2), out=out[p0:p1].view(n_b, cap, cap))


def _outer(plan: _Plan, sp: Tensor) -> Tensor:
    """(P,) products s_a * s_c of the row scales within each bucket."""
    out = sp.new_empty(plan.prod_off[-1])
    for k, (n_b, cap) in enumerate(plan.shapes):
        s_k = sp[plan.row_off[k] : plan.row_off[k + 1]].view(n_b, cap)
        torch.mul(s_k[:, :, None], s_k[:, None, :], out=out[plan.prod_off[k] : plan.prod_off[k + 1]].view(n_b, cap, cap))
    return out


class _Slices(NamedTuple):
    """Per active expert: its rows ``[row0, row0 + count)`` and its count^2 products
    ``[prod_off[k], prod_off[k+1])``; product p lands in the flattened G at ``flat[p]``."""

    rows: tuple[tuple[int, int], ...]  # (row0, count) per active expert
    prod_off: tuple[int, ...]
    flat: Tensor  # (P,) long


def _slices(d: Dispatch) -> _Slices:
    """Index plan of one sparse expert stack for :class:`_LoopGram` (numpy, no autograd)."""
    counts = np.asarray(d.counts, dtype=np.int64)  # (E,)
    starts = np.cumsum(counts) - counts
    active = np.flatnonzero(counts)
    sample = d.sample_idx.detach().cpu().numpy()  # (R,)
    prod_off = np.cumsum([0, *(counts[active] ** 2)])
    flat = np.empty(prod_off[-1], dtype=np.int64)
    n = d.n_samples
    for k, e in enumerate(active):
        s = sample[starts[e] : starts[e] + counts[e]]
        flat[prod_off[k] : prod_off[k + 1]] = (s[:, None] * n + s[None, :]).ravel()
    rows = tuple((int(starts[e]), int(counts[e])) for e in active)
    return _Slices(rows, tuple(int(o) for o in prod_off), torch.from_numpy(flat).to(d.sample_idx.device))


class _LoopGram(torch.autograd.Function):
    """(||G||_F^2, tr G, G) of G = Phi Phi^T / N, one matmul per active expert, hand-written backward.

    Forward: raw_e = Phi_e Phi_e^T on expert e's row slice, all written into one (P,) buffer and
    added into G by one ``index_add``. The upstream gradient dL/dG = 2 g G + t I is symmetric, so
    dPhi_e = 2 (dL/dG restricted to e) Phi_e is one matmul per expert written straight into its
    rows (no scatter).
    """

    @staticmethod
    def forward(ctx, n: int, sl: _Slices, phi: Tensor):  # type: ignore[override]
        raw = phi.new_empty(sl.prod_off[-1])  # (P,)
        for (r0, c), p0 in zip(sl.rows, sl.prod_off):
            rows = phi[r0 : r0 + c]  # (C, H), a view
            torch.mm(rows, rows.t(), out=raw[p0 : p0 + c * c].view(c, c))
        gram = phi.new_zeros(n * n).index_add_(0, sl.flat, raw).view(n, n).div_(n)
        ctx.n, ctx.sl = n, sl
        ctx.save_for_backward(phi, gram)
        ctx.mark_non_differentiable(gram)
        return gram.pow(2).sum(), gram.diagonal().sum(), gram

    @staticmethod
    @once_differentiable
    def backward(ctx, g_fro2: Tensor, g_trace: Tensor, _g_gram: Tensor):  # type: ignore[override]
        phi, gram = ctx.saved_tensors
        n, sl = ctx.n, ctx.sl
        d_gram = gram.flatten() * (4 * g_fro2 / n)  # 2 * dL/dG / N
        d_gram[:: n + 1] += 2 * g_trace / n
        d_prod = d_gram.index_select(0, sl.flat)  # (P,)
        d_phi = torch.empty_like(phi)  # active experts' slices tile every row
        for (r0, c), p0 in zip(sl.rows, sl.prod_off):
            torch.mm(d_prod[p0 : p0 + c * c].view(c, c), phi[r0 : r0 + c], out=d_phi[r0 : r0 + c])
        return None, None, d_phi


def _loop_suits(d: Dispatch) -> bool:
    """Sparse routing with few active experts (a full dispatch has its own bucket path)."""
    return sum(1 for c in d.counts if c) <= _LOOP_MAX_EXPERTS and not _is_full(d)


class _SampleGram(torch.autograd.Function):
    """(||G||_F^2, tr G, G) of G = Phi Phi^T / N with a hand-written backward.

    Per stack: padded rows P (one gather), raw = P P^T per bucket (one bmm each), prod = raw * (s s^T)
    scattered into G (one scatter_add; pad products land in a spare slot). The upstream gradient
    dL/dG = 2 g G + t I is symmetric, so dP = 2 (dprod * s s^T) P takes one bmm per bucket, and
    ds = 2 (dprod * raw) s one matrix-vector bmm per bucket; rows come back by one gather.
    """

    @staticmethod
    def forward(ctx, n: int, plans: list[_Plan], *tensors: Tensor | None):  # type: ignore[override]
        feats, scales = tensors[0::2], tensors[1::2]
        gram = feats[0].new_zeros(n * n + 1)  # the spare last slot takes pad products
        saved = []
        for f, s, plan in zip(feats, scales, plans):
            p = f.index_select(0, plan.rows)  # (T, H)
            raw = f.new_empty(plan.prod_off[-1])  # (P,)
            _bmm_buckets(plan, p, p, raw, b_is_prod=False)
            sp = None if s is None else s.index_select(0, plan.rows)  # (T,)
            outer = None if sp is None else _outer(plan, sp)  # (P,)
            prod = raw if outer is None else raw * outer
            if plan.flat is None:
                gram[: n * n] += prod.view(-1, n * n).sum(0)
            else:
                gram.scatter_add_(0, plan.flat, prod)
            saved.append((p, raw, sp, outer))
        gram = gram[: n * n].view(n, n) / n
        ctx.n, ctx.plans, ctx.saved = n, plans, saved
        ctx.has_scale = [s is not None for s in scales]
        ctx.save_for_backward(gram)
        ctx.mark_non_differentiable(gram)
        return gram.pow(2).sum(), gram.diagonal().sum(), gram

    @staticmethod
    @once_differentiable
    def backward(ctx, g_fro2: Tensor, g_trace: Tensor, _g_gram: Tensor):  # type: ignore[override]
        (gram,) = ctx.saved_tensors
        n = ctx.n
        # 2 * dL/dG / N, with a zero spare slot so pad entries get no gradient.
        d_gram = gram.new_zeros(n * n + 1)
        torch.mul(gram.flatten(), 4 * g_fro2 / n, out=d_gram[: n * n])
        d_gram[: n * n : n + 1] += 2 * g_trace / n
        grads: list[Tensor | None] = []
        for k, (plan, (p, raw, sp, outer)) in enumerate(zip(ctx.plans, ctx.saved)):
            need_f, need_s = ctx.needs_input_grad[2 + 2 * k], ctx.has_scale[k] and ctx.needs_input_grad[3 + 2 * k]
            if plan.flat is None:
                d_prod = d_gram[: n * n].repeat(plan.shapes[0][0])  # (E*N*N,)
            else:
                d_prod = d_gram.index_select(0, plan.flat)  # (P,)
            d_f = d_s = None
            # Each feature row sits in exactly one padded slot: gathering by slot replaces a scatter.
            if need_f:
                d_p = torch.empty_like(p)  # (T, H)
                _bmm_buckets(plan, d_prod if outer is None else d_prod * outer, p, d_p, b_is_prod=True)
                d_f = d_p.index_select(0, plan.slot_of_row)
            if need_s:
                weighted = d_prod * raw  # (P,)
                d_sp = torch.empty_like(sp)  # (T,)
                _bmm_buckets(plan, weighted, sp[:, None], d_sp[:, None], b_is_prod=True)
                d_s = d_sp.index_select(0, plan.slot_of_row)
            grads += [d_f, d_s]
        return (None, None, *grads)


def sample_gram_stats(blocks: Sequence[FeatureBlock]) -> tuple[Tensor, Tensor, Tensor]:
    """(||G||_F^2, tr G, G detached) of G = Phi Phi^T / N from routed rows only."""
    n = blocks[0].dispatch.n_samples
    if len(blocks) == 1 and _loop_suits(blocks[0].dispatch):
        return _LoopGram.apply(n, _slices(blocks[0].dispatch), blocks[0].scaled())
    plans = [_plan(b.dispatch, b.feats.shape[1]) for b in blocks]
    tensors: list[Tensor | None] = []
    for b in blocks:
        tensors += [b.feats, b.scale]
    return _SampleGram.apply(n, plans, *tensors)

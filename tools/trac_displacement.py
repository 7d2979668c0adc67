"""TRAC's two ways of carrying Adam's displacement, side by side on a 6-D noisy quadratic.

``kept`` (rl_moe's ``trac``) keeps Adam's iterate theta_base from step to step; ``recovered``
(``trac_authors``, as the authors' ``trac_optimizer``) recovers it each step from the point played,
as theta_ref + (theta - theta_ref) / (S_prev + eps), with the tuners' sigma starting at 1e-8. This prints how far apart the played points get (the largest
distance over the run, relative to the kept run's distance from theta_ref) while S is small, and
the share of the steps after S first falls to <= 0 at which each variant plays theta_ref. There
the recovered displacement is 0, so h is 0 and S moves only as its tuners decay: it stays <= 0
until the slow tuners outweigh the fast ones, or for good where they share a sign.

    python -m tools.trac_displacement [--steps 3000] [--seed 0]
"""

from __future__ import annotations

import argparse
import json

import torch

from rl_moe.algos.trac import TRAC, AuthorsTRAC


def trajectory(displacement: str, steps: int, seed: int, flip_at: int) -> tuple[list[torch.Tensor], list[float]]:
    """Played points and S of TRAC(Adam) on f(theta) = 0.5 |A (theta - c_t)|^2 + noise, the
    target c_t moving to -3 c_0 at ``flip_at`` (a task switch that drives S below 0)."""
    gen = torch.Generator().manual_seed(seed)
    a = torch.diag(torch.linspace(0.5, 3.0, 6, dtype=torch.float64))
    target = torch.randn(6, generator=gen, dtype=torch.float64)
    noise = torch.randn(steps, 6, generator=gen, dtype=torch.float64) * 0.3
    theta = torch.nn.Parameter(torch.zeros(6, dtype=torch.float64))
    opt = (TRAC if displacement == "kept" else AuthorsTRAC)([theta], lr=0.01)
    played, scales = [], []
    for t in range(steps):
        c = target if t < flip_at else -3.0 * target
        opt.zero_grad()
        theta.grad = a @ (a @ (theta.detach() - c)) + noise[t]
        opt.step()
        played.append(theta.detach().clone())
        scales.append(opt.logs()["trac_scale"])
    return played, scales


def compare(steps: int, seed: int) -> dict[str, object]:
    flip = steps // 3
    kept, s_kept = trajectory("kept", steps, seed, flip)
    rec, s_rec = trajectory("recovered", steps, seed, flip)
    # before the switch, where both played points have left theta_ref
    apart = [float((p - q).norm() / p.norm()) for p, q in zip(kept[:flip], rec[:flip]) if float(p.norm()) > 1e-9 and float(q.norm()) > 1e-9]

    def stuck_after_negative(scales: list[float], played: list[torch.Tensor]) -> tuple[int | None, float]:
        first = next((i for i, s in enumerate(scales) if i > 0 and s <= 0), None)
        if first is None:
            return None, 0.0
        later = played[first + 1 :]
        return first, sum(float(p.abs().max()) == 0.0 for p in later) / max(len(later), 1)

    k_first, k_stuck = stuck_after_negative(s_kept, kept)
    r_first, r_stuck = stuck_after_negative(s_rec, rec)
    return {
        "steps": steps, "seed": seed, "target_flips_at": flip,
        "before_the_switch": {
            "max_relative_distance": max(apart), "median_relative_distance": sorted(apart)[len(apart) // 2],
            "S_kept_range": [min(s_kept[:flip]), max(s_kept[:flip])], "S_recovered_range": [min(s_rec[:flip]), max(s_rec[:flip])],
        },
        "kept": {"first_step_S_le_0": k_first, "share_of_later_steps_at_theta_ref": k_stuck, "final_S": s_kept[-1]},
        "recovered": {"first_step_S_le_0": r_first, "share_of_later_steps_at_theta_ref": r_stuck, "final_S": s_rec[-1]},
    }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--seed", type=int, default=0)
    opts = parser.parse_args(argv)
    print(json.dumps(compare(opts.steps, opts.seed), indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

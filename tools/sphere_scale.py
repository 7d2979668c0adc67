"""SPHERE's scale on MetaWorld (docs/regularizers.md, "SPHERE's scale on MetaWorld").

    python -m tools.sphere_scale --out results/sphere_scale/rho0.1.jsonl
    python -m tools.sphere_scale --set reg.sphere.rho=0 --out results/sphere_scale/rho0.jsonl
    python -m tools.sphere_scale --set reg.sphere.scale_invariant=true --out results/sphere_scale/invariant.jsonl
    python -m tools.sphere_scale --suite cw10 --preset authors --seed 1 --task faucet-close-v3 --out probe.jsonl

Trains the paper's CW10 PPO config (Top-K E=10 K=2 + SPHERE) on one task for a few rollouts and
writes, for one minibatch in ``--every``, the penalty in float32 and recomputed in float64 from
the same features, tr(G), the gradient norms of the penalty and of the actor loss over the
parameters the run's rule takes them over (the actor network, and its log-std under
``reg.sphere.log_std_in_theta``), the coefficient the run's rule gives (``coef_mode``,
``norm_eps`` and ``eps`` as configured) and the share of exactly-zero last-hidden features.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from rl_moe.continual.agents import begin_task, build_model
from rl_moe.envs.factories import make_vec_env, task_factories
from rl_moe.continual.resolve import RunRequest, resolve, suite_of
from rl_moe.nn import MoEOutput
from rl_moe.regularizers.hooks import adaptive_coef
from rl_moe.regularizers.sphere import LOSS_COEF_RULES


def dense_phi64(out: MoEOutput) -> torch.Tensor:
    """(N, E*H) routing-weighted last-hidden features of the routed stack, in float64."""
    g = out.groups[-1]
    d = g.dispatch
    feats = g.expert.hidden[-1].detach().to(torch.float64)  # (R, H)
    dense = feats.new_zeros(d.n_samples, d.n_experts, feats.shape[1])
    dense[d.sample_idx, d.expert_idx] = d.weight.detach().to(torch.float64)[:, None] * feats
    return dense.reshape(d.n_samples, -1)


def summarize(rows: list[dict[str, float]], last: int = 10) -> dict[str, float]:
    """A probe's first recorded minibatch against its end (the mean of the ``last`` recorded ones)."""
    end = rows[-last:]
    mean = lambda key: sum(r[key] for r in end) / len(end)  # noqa: E731
    return {
        "trace_G_first": rows[0]["trace_G"], "trace_G_end": mean("trace_G"), "coef_end": mean("coef"),
        "coef_max": max(r["coef"] for r in rows), "zero_share_end": mean("feature_zero_share"), "steps": rows[-1]["step"],
    }  # fmt: skip


def summary_table(files: list[Path]) -> str:
    """Markdown table of :func:`summarize` over probe files (``NAME-TASK-sSEED.jsonl``)."""
    lines = ["| probe | tr(G) first → end | λ at the end (max) | zero share at the end | steps |", "|---|---|---|---|---|"]
    for f in sorted(files):
        rows = [json.loads(line) for line in f.read_text().splitlines() if line.strip()]
        if not rows:
            continue
        s = summarize(rows)
        lines.append(
            f"| {f.stem} | {s['trace_G_first']:.3g} → {s['trace_G_end']:.3g} | {s['coef_end']:.3g} ({s['coef_max']:.3g}) "
            f"| {s['zero_share_end']:.2f} | {int(s['steps']):,} |"
        )
    return "\n".join(lines)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--suite", default="cw10-cw", help="the suite whose rules and PPO config the probe trains under")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--preset", default=None, help="an override bundle of rl_moe.crl (e.g. authors)")
    p.add_argument("--task", default="hammer-v3")
    p.add_argument("--rollouts", type=int, default=3)
    p.add_argument("--every", type=int, default=20, help="record one minibatch in this many")
    p.add_argument("--set", action="append", default=[], dest="overrides")
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--summary", type=Path, nargs="+", default=None, help="print a table of these .jsonl files instead of training")
    return p


def main() -> None:
    p = _parser()
    args = p.parse_args()
    if args.summary is not None:
        print(summary_table(args.summary))
        return
    if args.out is None:
        p.error("--out is required unless --summary is given")
    torch.set_num_threads(1)
    cfg = resolve(RunRequest(suite=args.suite, method="sphere", seed=args.seed, tasks=1, device="cpu", preset=args.preset, overrides=tuple(args.overrides)))
    suite = suite_of(cfg)
    task = next(t for t in suite.tasks if t.name == args.task)
    model = build_model(cfg, make_vec_env(task_factories(suite, task, cfg.ppo.n_envs, 0), "dummy"), "cpu")
    begin_task(model, cfg, 0, 0)
    sphere = model.regularizers[0]
    actor = [prm for name, prm in model.policy.named_parameters() if ".actor_net." in name]
    if sphere.config.log_std_in_theta:
        actor.append(model.policy.log_std)
    network_loss = sphere.network_loss
    rows: list[dict[str, float]] = []
    calls = 0

    def recorded(out: MoEOutput, ref: torch.Tensor | None = None) -> torch.Tensor:
        nonlocal calls
        loss = network_loss(out, ref)
        calls += 1
        if (calls - 1) % args.every == 0 and ref is not None:
            def norm(t: torch.Tensor) -> float:
                grads = torch.autograd.grad(t, actor, retain_graph=True, allow_unused=True)
                return float(torch.sqrt(sum((g**2).sum() for g in grads if g is not None)))

            g_pen, g_act = norm(loss), norm(ref)
            c = sphere.config
            if c.rho == 0:
                coef = 0.0
            elif c.coef_mode == "adaptive":  # the learner's formula
                coef = float(adaptive_coef(c.rho, torch.tensor(g_act), torch.tensor(g_pen), c.eps, c.norm_eps))
            else:
                coef = float(LOSS_COEF_RULES[c.coef_mode](c.rho, ref, loss.detach(), c.eps))
            phi = dense_phi64(out)
            gram = phi @ phi.T / phi.shape[0]
            rows.append({
                "minibatch": calls, "step": model.num_timesteps, "loss_fp32": float(loss.detach()),
                "loss_fp64": float(gram.pow(2).sum() - gram.trace() ** 2 / phi.shape[1]), "trace_G": float(gram.trace()),
                "grad_norm_sphere": g_pen, "grad_norm_actor": g_act, "coef": coef,
                "feature_mean_abs": float(out.groups[-1].expert.hidden[-1].detach().abs().mean()),
                "feature_zero_share": float((out.groups[-1].expert.hidden[-1] == 0).float().mean()),
            })  # fmt: skip
        return loss

    sphere.network_loss = recorded
    model.learn(cfg.ppo.n_envs * cfg.ppo.n_steps * args.rollouts, reset_num_timesteps=False)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    first, last = rows[0], rows[-1]
    print(f"{args.out.name}: trace_G {first['trace_G']:.3g} -> {last['trace_G']:.3g}, loss {first['loss_fp64']:.3g} -> {last['loss_fp64']:.3g}, coef {first['coef']:.3g} -> {last['coef']:.3g}")


if __name__ == "__main__":
    main()

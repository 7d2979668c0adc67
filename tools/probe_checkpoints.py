"""Probe a run's checkpoints (and a fresh network of the same config) on a suite's held-out batch.

    python -m tools.probe_checkpoints RUN_DIR [RUN_DIR ...] [--suite cw10-cw] [--json out.json]

Prints one markdown row per network: r_e(K), r_e(A_last), dormant ratio, idle-expert fraction and
routing entropy on the batch that a new run of ``--suite`` collects (docs/metrics.md, "The
held-out batch"). Used for the fresh-vs-trained table in docs/metrics.md.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from pathlib import Path

import torch
from stable_baselines3.common.vec_env import DummyVecEnv

from rl_moe.continual.agents import build_model
from rl_moe.continual.config import RunConfig
from rl_moe.continual.probe_states import collect_probe_states, probe_factories
from rl_moe.continual.rng import env_seed
from rl_moe.continual.run_view import RunView
from rl_moe.envs.suites import load_suite
from rl_moe.diagnostics import ProbeConfig
from rl_moe.diagnostics.groups import plasticity_group, routing_group
from rl_moe.diagnostics.views import actor_view
from rl_moe.rundir import RunDir

TAGS = ("plasticity/entk_rank", "plasticity/feature_rank", "plasticity/dormant_ratio", "plasticity/idle_expert_fraction", "routing/entropy")


def probe(policy, states: torch.Tensor) -> dict[str, float]:
    view = actor_view(policy)
    values = plasticity_group(view, states)
    values.update(routing_group(view, states))
    return {k: float(values[k]) for k in TAGS if k in values}


def run_networks(run: Path) -> Iterator[tuple[str, torch.nn.Module]]:
    """The fresh network of ``run``'s config, then each finished task's end-of-task checkpoint.

    Yields (label, policy) on the CPU; the policy object is reused, so read it before the next.
    """
    rd = RunDir(run)
    cfg = RunConfig.from_dict(json.loads(rd.config.read_text()))
    results = json.loads(rd.results.read_text())
    sched = RunView(cfg, run)
    env = DummyVecEnv(sched.eval_factories(0)[:1])
    try:
        torch.manual_seed(cfg.seed)
        model = build_model(cfg, env, "cpu")
        yield "fresh", model.policy
        for i in range(int(results["finished_tasks"])):
            model.set_parameters(str(sched.checkpoint(i)), exact_match=True, device="cpu")
            yield f"after {sched.tasks[i].name}", model.policy
    finally:
        env.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("runs", nargs="+", type=Path)
    p.add_argument("--suite", default="cw10-cw", help="whose held-out batch (default cw10-cw, Continual World's rules)")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args()
    torch.set_num_threads(1)
    cfg_probe = ProbeConfig()
    states = collect_probe_states(probe_factories(load_suite(args.suite), env_seed(0, "probe")), cfg_probe.n_states, stride=cfg_probe.stride, policy="expert", noise=cfg_probe.noise, seed=0)
    rows = []
    for run in args.runs:
        for label, policy in run_networks(run):
            rows.append({"run": run.name, "network": label, **probe(policy, states)})
    print("| run | network | " + " | ".join(t.split("/")[1] for t in TAGS) + " |")
    print("|---|---|" + "---|" * len(TAGS))
    for r in rows:
        print(f"| {r['run']} | {r['network']} | " + " | ".join(f"{r[t]:.3f}" if t in r else "" for t in TAGS) + " |")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()

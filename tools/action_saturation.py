"""How far a run's Gaussian action means sit outside MetaWorld's action box, per checkpoint.

    python -m tools.action_saturation RUN_DIR [RUN_DIR ...] [--json out.json]

MetaWorld clips actions to [-1, 1]. Once the policy's mean leaves that box on most states, the
clipped action stops depending on the mean, so the environment no longer answers the actor's
changes there; a deterministic evaluation then repeats one trajectory checkpoint after
checkpoint. For the fresh network of the run's config and each task's end-of-task checkpoint,
this prints, on the run's own held-out probe batch (``probe_states.pt``): the share of action
entries with |mean| > 1, the median and largest |mean|, and the policy's std (mean over action
dimensions).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from tools.probe_checkpoints import run_networks


def saturation(policy, states: torch.Tensor) -> dict[str, float]:
    """Statistics of the action distribution's mean and std on ``states``."""
    with torch.no_grad():
        dist = policy.get_distribution(states).distribution
    mean = dist.mean.abs()
    return {
        "outside_box": float((mean > 1.0).float().mean()),
        "median_abs_mean": float(mean.median()),
        "max_abs_mean": float(mean.max()),
        "std": float(dist.stddev.mean()),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("runs", nargs="+", type=Path)
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args()
    torch.set_num_threads(1)
    rows = []
    for run in args.runs:
        states = torch.as_tensor(torch.load(run / "probe_states.pt", weights_only=True), dtype=torch.float32)
        for label, policy in run_networks(run):
            rows.append({"run": run.name, "network": label, **saturation(policy, states)})
    keys = ("outside_box", "median_abs_mean", "max_abs_mean", "std")
    print("| run | network | " + " | ".join(keys) + " |")
    print("|---|---|" + "---:|" * len(keys))
    for r in rows:
        print(f"| {r['run']} | {r['network']} | " + " | ".join(f"{r[k]:.2f}" for k in keys) + " |")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()

"""``python -m rl_moe.sweep``: a grid of suites × methods × algos × protocols × seeds.

Each grid point is one ``python -m rl_moe.crl`` run in a deterministic folder
``<out>/<suite>/<algo>-<method>-<protocol>-s<seed>``, so re-running the same sweep skips finished
trials (``results.json`` with ``"complete": true``) and resumes unfinished ones inside their task.
Trials start seed by seed (every method's seed 0 before any seed 1), so a sweep stopped at any
point has given its methods equal seed counts. A ``--method`` entry may be a named variant with
arguments of its own (``'lossratio=sphere --set reg.sphere.rho=0.05'``, folders
``<algo>-lossratio-<protocol>-s<seed>``); ``--heldout N`` scores every finished trial on N
held-out positions (``python -m rl_moe.positions``) and ``--experts`` records its expert usage
(``python -m rl_moe.experts``). Trials run on Ray
(a local cluster by default, ``--address`` to join one) or, without Ray, side by side in subprocesses
on this machine (``--backend local``, ``--parallel N`` at a time); ``--backend sequential`` runs them
one after another.

Example (the paper's CW10 comparison, 5 seeds; ``cw10`` is the SPHERE paper's protocol,
``cw10-cw`` Continual World's rules)::

    python -m rl_moe.sweep --suite cw10 --method topk sphere --protocol crl rl --seed 0 1 2 3 4

Several seeds side by side on one GPU machine (8 trials sharing the GPU, 2 CPUs each), on Ray or
without it::

    python -m rl_moe.sweep --suite cw10 --method sphere --seed 0 1 2 3 4 5 6 7 \
        --device cuda --cpus-per-trial 2 --gpus-per-trial 0.125
    python -m rl_moe.sweep --suite cw10 --method sphere --seed 0 1 2 3 4 5 6 7 \
        --device cuda --cpus-per-trial 2 --gpus-per-trial 0.125 --backend local --parallel 8

On a machine with several GPUs the local backend gives each running trial one of them
(``CUDA_VISIBLE_DEVICES``), spreading the trials evenly.

The sweep prints, and writes to ``<out>/sweep.json``, the env steps its trials trained together
per second of wall time.
"""

from __future__ import annotations

from rl_moe.sweep.run import (  # noqa: F401  (the package's public names)
    BACKENDS, LocalPlan, MethodSpec, Outcome, Outcomes, RayOptions, SweepConfig, SweepError, Throughput, Trial,
    TrialRunner, grid, is_complete, local_slots, main, parse, pin_gpu, plan_local, ray_available,
    resolve_backend, run_local, run_ray, run_sequential, run_subprocess, run_sweep, suite_label,
    trained_steps, trial_command, trial_env, validate, visible_gpus, write_manifest,
)  # fmt: skip

__all__ = [
    "BACKENDS", "LocalPlan", "MethodSpec", "Outcome", "Outcomes", "RayOptions", "SweepConfig", "SweepError", "Throughput", "Trial",
    "TrialRunner", "grid", "is_complete", "local_slots", "main", "parse", "pin_gpu", "plan_local", "ray_available",
    "resolve_backend", "run_local", "run_ray", "run_sequential", "run_subprocess", "run_sweep", "suite_label",
    "trained_steps", "trial_command", "trial_env", "validate", "visible_gpus", "write_manifest",
]  # fmt: skip

"""A task's periodic evaluation as the CLI runs it, this checkout against a baseline checkout.

``--suite cw10`` scores the training task on its eval envs (5 envs, 10 deterministic episodes of
500 steps; built once per task and reseeded before every evaluation, as
:class:`~rl_moe.continual.evaluation.EvalEnvs` does) about 22 times per task. Two worker
processes, one importing this checkout's ``rl_moe`` and one a baseline's (``--baseline``, a
``git worktree`` of the older commit), each build the Top-K + SPHERE learner as
``python -m rl_moe.crl --suite cw10 --method sphere`` does (its weights at their
initialisation: the evaluation's cost does not depend on them), build the task's eval envs and
evaluate once to warm them up; then each round is one evaluation, in thread CPU time. Rounds
alternate a b b a; the ratio is the median of the per-pair ratios. The two workers' scores
(success per episode, returns, success at the last step) must be equal: the same policy on the
same goals.

    git worktree add --detach /tmp/rl_moe-base <commit>
    OMP_NUM_THREADS=1 python benchmarks/eval_speed.py --baseline /tmp/rl_moe-base [--task hammer-v3] [--rounds 6]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent

sys.path.insert(0, str(HERE))
from _workers import ROOT, alternated, baseline_pair, describe  # noqa: E402  (a sibling module of this script)


def _worker(task_name: str) -> None:
    """Build the learner and the task's eval envs from whichever ``rl_moe`` is first on the path;
    per ``eval`` line on stdin print the thread CPU seconds and the scores of one evaluation."""
    import torch

    import rl_moe
    from rl_moe.continual.agents import begin_task, build_model
    from rl_moe.continual.evaluation import EvalEnvs, evaluate
    from rl_moe.continual.resolve import RunRequest, resolve, suite_of
    from rl_moe.continual.rng import env_seed
    from rl_moe.envs.factories import make_vec_env, task_factories

    torch.set_num_threads(1)
    cfg = resolve(RunRequest(suite="cw10", method="sphere", tasks=10, vec_env="dummy", device="cpu"))
    suite = suite_of(cfg)
    task = next(t for t in suite.tasks if t.name == task_name)
    env = make_vec_env(task_factories(suite, task, cfg.ppo.n_envs, 0), "dummy")
    model = build_model(cfg, env, "cpu")
    begin_task(model, cfg, 0, 0)
    pool = EvalEnvs(task_factories(suite, task, cfg.eval.n_envs, env_seed(0, "eval")), "dummy")
    evaluate(model, pool, cfg.eval.n_episodes)  # builds the envs, as a task's first evaluation does
    print(json.dumps({"ready": str(Path(rl_moe.__file__).parent), "episodes": cfg.eval.n_episodes, "envs": cfg.eval.n_envs}), flush=True)
    for _ in sys.stdin:
        t0 = time.thread_time()
        res = evaluate(model, pool, cfg.eval.n_episodes)
        seconds = time.thread_time() - t0
        print(json.dumps({"seconds": seconds, "scores": [res.success, res.mean_return, res.success_last, list(res.env_success)]}), flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--baseline", type=Path, help="a checkout of the commit to compare against (e.g. a git worktree)")
    p.add_argument("--task", default="hammer-v3")
    p.add_argument("--rounds", type=int, default=6, help="evaluations per checkout, alternated a b b a")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        _worker(args.task)
        return
    new, base = baseline_pair(args.baseline, "eval_speed.py", ["--task", args.task])
    commit = {"new": describe(ROOT), "base": describe(args.baseline)}
    answers = alternated(new, base, lambda w: w.ask("eval"), args.rounds)
    new.close()
    base.close()
    seconds = {name: [float(a["seconds"]) for a in got] for name, got in answers.items()}
    scores = {name: [a["scores"] for a in got] for name, got in answers.items()}
    pairs = [n / b for n, b in zip(seconds["new"], seconds["base"])]
    same = scores["new"] == scores["base"] and len({json.dumps(s) for s in scores["new"]}) == 1
    print(f"cw10 {args.task}: one periodic evaluation (10 deterministic episodes on 5 reused eval envs), Top-K + SPHERE at its init, 1 thread, {args.rounds} alternated rounds")
    print(f"  this checkout {commit['new']}: {statistics.median(seconds['new']):.2f} s per evaluation; baseline {commit['base']}: {statistics.median(seconds['base']):.2f} s")
    print(f"  new / baseline: {statistics.median(pairs):.3f} (per-round ratios {min(pairs):.3f}–{max(pairs):.3f})")
    print(f"  scores (success, return, success at the last step, per env): {'equal in every round' if same else 'DIFFERENT'}")


if __name__ == "__main__":
    main()

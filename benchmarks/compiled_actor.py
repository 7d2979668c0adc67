"""``torch.compile`` on the slice's Top-K actor: compiled forward + backward time over eager's, in
one run.

The actor as ``--suite cw10`` builds it (the authors' network: E = 10 experts of 3 x 256, K = 2,
a 3 x 256 gate, LeCun init), one forward and backward of a squared-output loss at a PPO
minibatch's 256 rows, each call on fresh states so that the routed segments' sizes change as they
do between minibatches (hence ``dynamic=True``). Thread CPU time, eager and compiled alternated per
round, medians. Compiling needs a C++ compiler; its wall time is printed too.

    OMP_NUM_THREADS=1 python benchmarks/compiled_actor.py [--rounds 3] [--calls 20]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from rl_moe.nn import NetConfig, build_network


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--calls", type=int, default=20, help="timed calls per variant and round")
    p.add_argument("--batch", type=int, default=256)
    args = p.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    net = build_network(39, 4, NetConfig(kind="topk", gate_hidden=(256, 256, 256), init="lecun"))
    base = torch.randn(args.batch, 39)

    def step(f: torch.nn.Module) -> None:
        net.zero_grad(set_to_none=True)
        f(base + 0.1 * torch.randn_like(base)).out.pow(2).mean().backward()

    t0 = time.perf_counter()
    compiled = torch.compile(net, dynamic=True)
    for _ in range(3):  # compile, then any recompilation the first segment sizes cause
        step(compiled)
    print(f"compiling: {time.perf_counter() - t0:.0f} s wall")

    def median_call(f: torch.nn.Module) -> float:
        times = []
        for _ in range(args.calls):
            t = time.thread_time()
            step(f)
            times.append(time.thread_time() - t)
        return statistics.median(times)

    ratios = []
    for r in range(args.rounds):
        eager_s, compiled_s = median_call(net), median_call(compiled)
        ratios.append(compiled_s / eager_s)
        print(f"round {r}: eager {eager_s * 1e3:.2f} ms, compiled {compiled_s * 1e3:.2f} ms, compiled / eager {ratios[-1]:.2f}")
    print(f"compiled / eager, median over rounds: {statistics.median(ratios):.2f} (< 1: compiling pays)")


if __name__ == "__main__":
    main()

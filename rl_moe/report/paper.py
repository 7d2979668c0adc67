"""The SPHERE paper's per-task CW10 success (Tables 13 and 14, mean ± std over 5 seeds), shown next
to measured success in the report's tables."""

from __future__ import annotations

from rl_moe.report.stats import MeanStd

CW10_TASKS = (
    "hammer", "push-wall", "faucet-close", "push-back", "stick-pull",
    "handle-press-side", "push", "shelf-place", "window-close", "peg-unplug-side",
)  # fmt: skip

#: Env steps per task behind Tables 13 and 14 (the paper's MetaWorld budget).
PAPER_STEPS_PER_TASK = 1_000_000

#: Paper column -> rl_moe ``--method`` name.
METHODS = {"PPO": "dense", "PPO(10x)": "dense10x", "Top-K MoE": "topk", "LN": "ln", "SPHERE": "sphere", "C-CHAIN": "cchain", "CBP": "cbp", "PW": "parseval"}


def _table(columns: tuple[str, ...], rows: tuple[str, ...]) -> dict[str, dict[str, MeanStd]]:
    """method -> task -> value, from rows "m ± s m ± s ..." in ``columns`` order, CW10's tasks in
    order and then the average row (its std is over seeds of the 10-task mean)."""
    out: dict[str, dict[str, MeanStd]] = {METHODS[c]: {} for c in columns}
    for task, row in zip((*CW10_TASKS, "average"), rows, strict=True):
        nums = [float(x) for x in row.replace("±", " ").split()]
        for c, (m, s) in zip(columns, zip(nums[::2], nums[1::2])):
            out[METHODS[c]][task] = MeanStd(m, s, 5)
    return out


#: protocol -> method -> CW10 task (no version suffix) or "average" -> success.
TABLES: dict[str, dict[str, dict[str, MeanStd]]] = {
    "rl": _table(("PPO", "PPO(10x)", "Top-K MoE", "LN", "SPHERE", "C-CHAIN", "CBP", "PW"), (  # Table 13
        "0.76 ± 0.39 1.00 ± 0.00 0.98 ± 0.04 0.40 ± 0.42 0.96 ± 0.08 0.90 ± 0.16 1.00 ± 0.00 1.00 ± 0.00",
        "0.96 ± 0.05 0.80 ± 0.28 1.00 ± 0.00 0.25 ± 0.38 1.00 ± 0.00 0.78 ± 0.35 1.00 ± 0.00 0.90 ± 0.13",
        "1.00 ± 0.00 1.00 ± 0.00 1.00 ± 0.00 1.00 ± 0.00 1.00 ± 0.00 1.00 ± 0.00 0.92 ± 0.16 1.00 ± 0.00",
        "0.18 ± 0.27 0.33 ± 0.47 0.00 ± 0.00 0.23 ± 0.39 0.02 ± 0.04 0.20 ± 0.40 0.16 ± 0.32 0.00 ± 0.00",
        "0.00 ± 0.00 0.00 ± 0.00 0.00 ± 0.00 0.00 ± 0.00 0.16 ± 0.32 0.00 ± 0.00 0.00 ± 0.00 0.00 ± 0.00",
        "1.00 ± 0.00 1.00 ± 0.00 1.00 ± 0.00 1.00 ± 0.00 1.00 ± 0.00 1.00 ± 0.00 1.00 ± 0.00 1.00 ± 0.00",
        "0.68 ± 0.34 0.83 ± 0.17 0.82 ± 0.27 0.57 ± 0.12 1.00 ± 0.00 0.94 ± 0.08 0.96 ± 0.05 0.96 ± 0.05",
        "0.00 ± 0.00 0.00 ± 0.00 0.00 ± 0.00 0.00 ± 0.00 0.00 ± 0.00 0.00 ± 0.00 0.00 ± 0.00 0.00 ± 0.00",
        "1.00 ± 0.00 1.00 ± 0.00 1.00 ± 0.00 1.00 ± 0.00 1.00 ± 0.00 1.00 ± 0.00 1.00 ± 0.00 1.00 ± 0.00",
        "0.92 ± 0.12 0.65 ± 0.35 0.90 ± 0.13 0.83 ± 0.24 1.00 ± 0.00 0.84 ± 0.23 0.84 ± 0.08 0.86 ± 0.15",
        "0.65 ± 0.12 0.66 ± 0.13 0.67 ± 0.04 0.53 ± 0.16 0.71 ± 0.04 0.67 ± 0.12 0.69 ± 0.06 0.67 ± 0.03",
    )),
    "crl": _table(("PPO", "PPO(10x)", "Top-K MoE", "LN", "SPHERE", "PW", "C-CHAIN", "CBP"), (  # Table 14
        "1.00 ± 0.00 0.97 ± 0.05 0.98 ± 0.04 0.48 ± 0.43 0.98 ± 0.04 1.00 ± 0.00 0.80 ± 0.40 0.60 ± 0.45",
        "0.20 ± 0.40 0.00 ± 0.00 0.00 ± 0.00 0.24 ± 0.39 0.70 ± 0.25 0.00 ± 0.00 0.04 ± 0.08 0.18 ± 0.36",
        "0.14 ± 0.23 0.67 ± 0.47 0.38 ± 0.47 1.00 ± 0.00 1.00 ± 0.00 0.70 ± 0.38 0.38 ± 0.38 1.00 ± 0.00",
        "0.00 ± 0.00 0.00 ± 0.00 0.00 ± 0.00 0.14 ± 0.28 0.00 ± 0.00 0.00 ± 0.00 0.00 ± 0.00 0.18 ± 0.36",
        "0.00 ± 0.00 0.00 ± 0.00 0.00 ± 0.00 0.00 ± 0.00 0.00 ± 0.00 0.00 ± 0.00 0.00 ± 0.00 0.00 ± 0.00",
        "0.50 ± 0.42 0.45 ± 0.45 0.50 ± 0.45 0.82 ± 0.36 0.98 ± 0.04 0.62 ± 0.39 0.60 ± 0.45 0.70 ± 0.40",
        "0.00 ± 0.00 0.05 ± 0.05 0.00 ± 0.00 0.46 ± 0.41 0.22 ± 0.17 0.00 ± 0.00 0.00 ± 0.00 0.06 ± 0.08",
        "0.00 ± 0.00 0.00 ± 0.00 0.00 ± 0.00 0.00 ± 0.00 0.00 ± 0.00 0.00 ± 0.00 0.00 ± 0.00 0.00 ± 0.00",
        "0.00 ± 0.00 0.00 ± 0.00 0.20 ± 0.40 0.62 ± 0.43 1.00 ± 0.00 0.03 ± 0.04 0.40 ± 0.49 0.20 ± 0.40",
        "0.00 ± 0.00 0.00 ± 0.00 0.00 ± 0.00 0.00 ± 0.00 0.02 ± 0.04 0.00 ± 0.00 0.02 ± 0.04 0.00 ± 0.00",
        "0.18 ± 0.11 0.21 ± 0.10 0.21 ± 0.14 0.38 ± 0.23 0.49 ± 0.06 0.23 ± 0.08 0.22 ± 0.18 0.29 ± 0.21",
    )),
}


def paper_cells(protocol: str, method: str, tasks: tuple[str, ...]) -> tuple[MeanStd, ...] | None:
    """The paper's success of ``method`` on each of ``tasks`` (MetaWorld v3 names) under
    ``protocol``, then its average (None for a slice: the paper averages over all of CW10), or
    None unless the paper reports every task.

    Under CRL a task's number depends on the tasks before it, so CRL cells are given only for a
    prefix of CW10 in CW10's order.
    """
    table = TABLES.get(protocol, {}).get(method)
    names = tuple(t.removesuffix("-v3") for t in tasks)
    if table is None or not all(n in table for n in names):
        return None
    if protocol == "crl" and names != CW10_TASKS[: len(names)]:
        return None
    average = table["average"] if names == CW10_TASKS else MeanStd(float("nan"), float("nan"), 0)
    return (*(table[n] for n in names), average)

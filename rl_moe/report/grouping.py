"""Which table and row a run belongs in: its method named by the settings it moved, and runs of
one suite on different networks, lambda arithmetics or protocols set apart, each named by what
differs (``cw10 [sb3 network]``, ``sphere [ours lambda]``, ``paper-hammer [joint gradient
clipping]``), so that no table mixes them."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import replace
from typing import Any

from rl_moe.continual.config import RunConfig
from rl_moe.continual.networks import NETWORKS
from rl_moe.continual.resolve import moved_settings
from rl_moe.errors import UsageError
from rl_moe.report.runs import Run


def with_config(run: Run) -> Run:
    """The run with what its ``config.json`` says: its method named with the regularizer settings
    it moved away from the method's own (``sphere [sphere.rho=0.001]``,
    :func:`rl_moe.continual.resolve.moved_settings`), so that a ``--set reg.*`` variant never
    shares a table row or a seed slot with the method itself; and the network and SPHERE lambda
    arithmetic it trained with (:meth:`~rl_moe.continual.config.RunConfig.labels`). Runs without a
    readable ``config.json`` keep their method's name and no labels."""
    try:
        cfg = RunConfig.from_dict(json.loads((run.path / "config.json").read_text()))
        moved, labels = moved_settings(cfg), cfg.labels()
    except (OSError, ValueError, KeyError, TypeError, UsageError):
        return run  # no config.json, or one this version cannot read
    run = replace(run, network=labels["network"], arithmetic=labels.get("lambda_arithmetic", ""))
    if not moved:
        return run
    label = ", ".join(f"{k}={v}" for k, v in sorted(moved.items()))
    return replace(run, key=replace(run.key, method=f"{run.key.method} [{label}]"))


def split_by_network(runs: list[Run]) -> list[Run]:
    """Runs of one suite and learner on different networks go into tables of their own, named by
    the network (``cw10 [sb3 network]``); runs of one method with different lambda arithmetics
    into rows of their own (``sphere [ours lambda]``). A study on one network keeps its names, and
    the report says the network above its tables."""
    networks: dict[tuple[str, str], set[str]] = {}
    arithmetics: dict[tuple[str, str, str], set[str]] = {}
    for r in runs:
        networks.setdefault((r.key.suite, r.key.algo), set()).add(r.network)
        arithmetics.setdefault((r.key.suite, r.key.algo, r.key.method), set()).add(r.arithmetic)
    out = []
    for r in runs:
        key = r.key
        if len(arithmetics[(key.suite, key.algo, key.method)]) > 1:
            key = replace(key, method=f"{key.method} [{r.arithmetic or 'unrecorded'} lambda]")
        if len(networks[(key.suite, key.algo)]) > 1:
            key = replace(key, suite=f"{key.suite} [{r.network or 'unrecorded'} network]")
        out.append(replace(r, key=key))
    return out


def describe_network(runs: Iterable[Run]) -> str:
    """One line naming the networks and SPHERE lambda arithmetics of ``runs``."""
    nets = sorted({r.network or "unrecorded (no config.json)" for r in runs})
    text = ", ".join(f"{n} ({NETWORKS[n].description})" if n in NETWORKS else n for n in nets)
    lam = sorted({r.arithmetic for r in runs if r.arithmetic})
    return text + (f"; SPHERE's lambda arithmetic: {', '.join(lam)}" if lam else "")


def _rule_parts(rules: dict[str, Any]) -> dict[str, str]:
    """Each recorded rule as the words the report prints for it."""
    parts = {"episode_length": f"{rules.get('episode_length')}-step episodes"}
    parts.update({f"task_fields.{k}": f"{k} {v}" for k, v in sorted((rules.get("task_fields") or {}).items())})
    if rules.get("grad_clip"):
        parts["grad_clip"] = f"{rules['grad_clip']} gradient clipping"
    parts["eval_positions"] = f"evaluated on {rules.get('eval_positions')} positions"
    return parts


def split_by_rules(runs: list[Run]) -> list[Run]:
    """One table per protocol: runs of a suite and learner that ran under different rules (a
    ``--set ppo.grad_clip=joint`` beside the suite's own, or runs from before a rule was recorded)
    go into groups of their own, each named by the suite and the rules that set it apart
    (``paper-hammer [joint gradient clipping]``), so no table ever mixes protocols."""
    sets: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in runs:
        seen = sets.setdefault((r.key.suite, r.key.algo), [])
        if r.rules not in seen:
            seen.append(r.rules)
    out = []
    for r in runs:
        seen = sets[(r.key.suite, r.key.algo)]
        if len(seen) > 1:
            ours = _rule_parts(r.rules) if r.rules else {"rules": "rules not recorded"}
            others = [_rule_parts(o) for o in seen if o and o != r.rules]  # an unrecorded set stands apart anyway
            apart = [text for key, text in ours.items() if any(o.get(key) != text for o in others)]
            apart = apart or list(ours.values())  # the others only add a rule: name all of ours
            r = replace(r, key=replace(r.key, suite=f"{r.key.suite} [{', '.join(apart)}]"))
        out.append(r)
    return out


def describe_rules(rules: dict[str, Any]) -> str:
    """One line naming a run's protocol (``results.json``'s ``rules``)."""
    if not rules:
        return "rules not recorded (results.json written before it held them)"
    return ", ".join(_rule_parts(rules).values())

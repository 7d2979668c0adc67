"""Digests of a finished run, to show that two runs trained the same, bit for bit.

``tests/test_training_fingerprint.py`` compares them against recorded values (a refactor lands only
with them unchanged), and ``tools/same_training.py`` compares two commits' runs of one
command, so that a results table may mix those commits (docs/results.md, "Evidence").
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Collection
from pathlib import Path

import numpy as np
import torch
from stable_baselines3.common.save_util import load_from_zip_file
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from rl_moe.tblog import quiet_tensorboard

#: results.json's numbers (not its bookkeeping: commits, timings, backends)
RESULT_KEYS = ("tasks", "steps_per_task", "success_matrix", "own_success", "final_success", "eval_curves", "cl_metrics", "task_segments")


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:16]


def scalars(run: Path) -> dict[str, list[tuple[int, float]]]:
    """Every TensorBoard scalar of a run but wall-clock timings (``time/*``)."""
    acc = EventAccumulator(str(run / "tb"), size_guidance={"scalars": 0})
    with quiet_tensorboard():
        acc.Reload()
    tags = [t for t in acc.Tags()["scalars"] if not t.startswith("time/")]
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in tags}


def fingerprint(run: Path, tags: Collection[str] | None = None) -> dict[str, str]:
    """Digests of every checkpoint's weights (policy and optimizer), of the TensorBoard scalars
    (only ``tags`` where given: runs of commits that log different tags compare on the shared
    ones) and of results.json's numbers."""
    weights = hashlib.sha256()
    for ckpt in sorted((run / "checkpoints").glob("*.zip")):
        _, params, _ = load_from_zip_file(str(ckpt), device="cpu")
        for part in sorted(params):
            state = params[part]
            for key in sorted(state):  # optimizer states nest dicts and lists of tensors
                weights.update(f"{ckpt.name}/{part}/{key}".encode())
                weights.update(repr(_flat(state[key])).encode())
    logged = {t: p for t, p in scalars(run).items() if tags is None or t in tags}
    results = json.loads((run / "results.json").read_text())
    return {
        "weights": weights.hexdigest()[:16],
        "scalars": digest(repr(sorted((t, [(s, np.float32(v).tobytes().hex()) for s, v in p]) for t, p in logged.items())).encode()),
        "scalar_tags": str(len(logged)),
        "results": digest(json.dumps({k: results[k] for k in RESULT_KEYS}, sort_keys=True).encode()),
    }


def _flat(value: object) -> object:
    """Tensors as their bytes, containers walked in order (a digest of the exact values)."""
    if isinstance(value, torch.Tensor):
        return (str(value.dtype), tuple(value.shape), value.detach().contiguous().numpy().tobytes().hex())
    if isinstance(value, dict):
        return [(str(k), _flat(value[k])) for k in sorted(value, key=str)]
    if isinstance(value, (list, tuple)):
        return [_flat(v) for v in value]
    return repr(value)

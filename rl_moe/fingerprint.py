"""Digests of a finished run, to show that two runs trained the same, bit for bit.

``tests/test_training_fingerprint.py`` compares them against recorded values (a refactor lands only
with them unchanged), and ``tools/same_training.py`` compares two commits' runs of one
command, so that a results table may mix those commits (docs/results.md, "Machine, software and provenance").
"""

from __future__ import annotations

import hashlib
import json
import platform
import re
from collections.abc import Collection, Mapping
from importlib import metadata
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


# ---- what decides the CPU kernels ------------------------------------------------------------------
#: CPU flags that name instruction sets a kernel may be dispatched on (oneDNN, MKL, numpy's SIMD
#: paths, MuJoCo); mitigation, virtualisation and bookkeeping flags are left out.
_ISA_FLAG = re.compile(r"(sse\w*|ssse3|avx\w*|amx\w*|fma\w*|f16c|bmi\d|adx|popcnt|abm|lzcnt|movbe|gfni|v?aes|v?pclmulqdq|sha_ni)")

#: The description's fields in the order a difference is reported, each with its name in words.
MACHINE_FIELDS: dict[str, str] = {
    "cpu": "CPU model",
    "cpu_flags": "CPU instruction-set flags",
    "cpu_capability": "torch's CPU capability",
    "torch": "torch",
    "mkl": "MKL",
    "onednn": "oneDNN",
    "numpy": "numpy",
    "mujoco": "MuJoCo",
}


def kernel_machine(cpuinfo: str | None = None, torch_config: str | None = None) -> dict[str, str]:
    """What decides which CPU kernels a run uses, so that bit-identical results are expected only
    where all of it agrees: the CPU model and its instruction-set flags, torch's version and CPU
    capability, the MKL and oneDNN it was built with, numpy's and MuJoCo's versions. Two CPUs with
    one ``cpu_capability`` ("AVX512") can still differ (one with AMX and AVX512-FP16 took other
    kernels and gave other weights).

    :param cpuinfo: the text of ``/proc/cpuinfo`` (read here when None; absent off Linux)
    :param torch_config: ``torch.__config__.show()`` (asked here when None)
    """
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            cpuinfo = ""
    first: dict[str, str] = {}
    for line in cpuinfo.splitlines():  # the first processor's block
        if not line.strip():
            if first:
                break
            continue
        key, _, value = line.partition(":")
        first.setdefault(key.strip(), value.strip())
    if "model name" in first:
        cpu = f"{first['model name']} ({first.get('vendor_id', '?')} family {first.get('cpu family', '?')} model {first.get('model', '?')})"
    else:
        cpu = platform.processor() or platform.machine() or "unknown"
    flags = sorted(f for f in first.get("flags", "").split() if _ISA_FLAG.fullmatch(f))
    shown = torch_config if torch_config is not None else torch.__config__.show()
    mkl = re.search(r"Math Kernel Library Version ([\w.]+)\S*\s+Build (\d+)", shown)
    onednn = re.search(r"MKL-DNN v(\S+)", shown)
    try:
        mujoco = metadata.version("mujoco")
    except metadata.PackageNotFoundError:  # not installed: no MetaWorld run can happen
        mujoco = "none"
    return {
        "cpu": cpu,
        "cpu_flags": " ".join(flags) if flags else "unknown",
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "torch": torch.__version__,
        "mkl": f"{mkl.group(1)} build {mkl.group(2)}" if mkl else "none",
        "onednn": onednn.group(1) if onednn else "none",
        "numpy": np.__version__,
        "mujoco": mujoco,
    }


def machine_differences(recorded: Mapping[str, str], here: Mapping[str, str]) -> list[str]:
    """How ``here`` differs from the machine a recording was made on, one phrase per field (empty:
    the same kernels). A field the recording lacks counts as a difference: it was not written
    down, so nothing says the kernels agree."""
    out, unknown = [], []
    for key, name in MACHINE_FIELDS.items():
        want, got = recorded.get(key), here.get(key)
        if want == got:
            continue
        if want is None:
            unknown.append(name)
        elif key == "cpu_flags":
            missing, extra = sorted(set(want.split()) - set(got.split())), sorted(set(got.split()) - set(want.split()))
            parts = ([f"lacks {' '.join(missing)}"] if missing else []) + ([f"adds {' '.join(extra)}"] if extra else [])
            out.append(f"{name}: this machine {', '.join(parts)}")
        else:
            out.append(f"{name} {want} there, {got} here")
    if unknown:
        out.append(f"the recording does not say its {', '.join(unknown)}")
    return out

"""Copy the compact part of run folders into results/: what the report and the docs need.

    python -m tools.collect_runs ~/rl_moe-runs/mw3easy results/mw3easy

Keeps ``config.json``, ``results.json``, the TensorBoard events (``tb/``), the probe batch
(``probe_states.pt``, 40 kB), ``sweep.log``, the held-out scores of ``python -m
rl_moe.positions`` (``positions-<N>.json``) and the expert usage of ``python -m rl_moe.experts``
(``experts.json``); leaves out checkpoints (19 MB each on CW10).
Runs still in progress are copied as they stand (their results.json counts the finished tasks).

    python -m tools.collect_runs --tasks 3 ~/rl_moe-runs/cw10-paper/ppo-topk-crl-s5 results/cw10-paper/ppo-topk-crl-s5

``--tasks N`` copies a run as it stood after its first N tasks: a slice run that went on over
CW10 (``--tasks 10``) in its own folder is still one of the slice's runs. Its results.json and
config.json are cut to those tasks (:meth:`~rl_moe.continual.results.Results.head`) and its
TensorBoard events to the steps up to the end of task N; ``sweep.log`` stays whole, as the record of
every command that wrote the folder.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

from tensorboard.backend.event_processing.event_file_loader import RawEventFileLoader
from tensorboard.compat.proto.event_pb2 import Event
from tensorboard.summary.writer.record_writer import RecordWriter

from rl_moe.atomic import write_json_atomic
from rl_moe.continual.results import Results
from rl_moe.continual.scheduler_eval import in_first_tasks
from rl_moe.experts import EXPERTS_FILE
from rl_moe.rundir import RunDir

KEEP = ("config.json", "results.json", "probe_states.pt", "sweep.log")
#: Kept whole when a run is copied whole, and by a cut copy only where it covers exactly its tasks.
PER_TASKS = (EXPERTS_FILE,)


def cut_events(src: Path, dst: Path, last_step: int, tasks: int) -> int:
    """Copy the TensorBoard event file ``src`` to ``dst`` without what a run logged after its
    first ``tasks`` tasks, which ended at ``last_step``: the events past that step, the next
    task's start evaluation, logged at that step, and the later tasks' points of the tags against
    the task index (:func:`~rl_moe.continual.scheduler_eval.in_first_tasks`, the end step kept). The others
    are copied byte for byte and in their order (the report keeps the value read last); a file
    left with no logged value is not written. Returns the events left out."""
    kept, dropped = [], 0
    for record in RawEventFileLoader(str(src)).Load():
        event = Event.FromString(record)
        tags = [v.tag for v in event.summary.value] or [""]  # an event with no value by its step
        if not all(in_first_tasks(tag, event.step, tasks, last_step, keep_end_step=True) for tag in tags):
            dropped += 1
        else:
            kept.append((record, event.HasField("file_version")))
    if not all(version for _, version in kept):
        with dst.open("wb") as f:
            writer = RecordWriter(f)
            for record, _ in kept:
                writer.write(record)
    return dropped


def head_of(run: Path, tasks: int) -> Results:
    """The run's results as they stood after its first ``tasks`` tasks.

    :raises ValueError: if the run cannot be cut there (:meth:`Results.head`), or its files disagree
    """
    try:
        res = Results.from_dict(json.loads((run / "results.json").read_text())).head(tasks)
        res.to_dict()  # its metrics too
        if json.loads((run / "config.json").read_text())["tasks"][:tasks] != res.tasks:
            raise ValueError("config.json and results.json name other tasks")
        return res
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{run}: --tasks {tasks}: {e}") from None


def write_head(run: Path, out: Path, res: Results) -> None:
    """Write into ``out`` the parts of ``run`` that :func:`head_of` cuts to ``res``: results.json,
    config.json, the positions files over exactly its tasks and the TensorBoard events."""
    n = len(res.tasks)
    write_json_atomic(out / "results.json", res.to_dict())
    config = json.loads((run / "config.json").read_text())
    write_json_atomic(out / "config.json", {**config, "tasks": config["tasks"][:n]})
    per_tasks = [run / name for name in PER_TASKS if (run / name).is_file()]
    for scores in [*RunDir(run).positions_files().values(), *per_tasks]:
        # scored later, over more tasks: its last checkpoint is not the view's
        if json.loads(scores.read_text()).get("tasks") == res.tasks:
            shutil.copy2(scores, out / scores.name)
        else:
            print(f"{out}: left out {scores.name}, which does not cover exactly the first {n} tasks")
    for events in sorted((run / "tb").rglob("events.out.tfevents.*")):
        target = out / "tb" / events.relative_to(run / "tb")
        target.parent.mkdir(parents=True, exist_ok=True)
        cut_events(events, target, res.global_step, n)


def collect(src: Path, dst: Path, tasks: int | None = None) -> list[Path]:
    """Copy every run folder under ``src`` (a folder holding config.json) to the same place under
    ``dst``; with ``tasks``, each as it stood after its first ``tasks`` tasks (:func:`write_head`).
    Each copy is written beside its place and then swapped in, so a failure leaves the previous copy.

    :raises ValueError: before anything is written, if a run has fewer than ``tasks`` evaluated tasks
    """
    runs = [config.parent for config in sorted(src.rglob("config.json"))]
    heads = {run: head_of(run, tasks) for run in runs} if tasks is not None else {}
    copied = []
    for run in runs:
        final = dst / run.relative_to(src)
        out = final.with_name(final.name + ".partial")
        if out.exists():
            shutil.rmtree(out)
        try:
            copy_run(run, out, heads.get(run))
        except BaseException:
            shutil.rmtree(out, ignore_errors=True)  # a report would read a half copy as one more run
            raise
        if final.exists():
            shutil.rmtree(final)
        out.rename(final)
        copied.append(final)
    return copied


def copy_run(run: Path, out: Path, head: Results | None) -> None:
    """Copy the compact part of ``run`` into the new folder ``out``, cut to ``head`` if given."""
    out.mkdir(parents=True)
    if head is not None:
        write_head(run, out, head)
    for name in KEEP:
        if (run / name).is_file() and not (out / name).exists():
            shutil.copy2(run / name, out / name)
    if head is None:
        for scores in RunDir(run).positions_files().values():
            shutil.copy2(scores, out / scores.name)
        for name in PER_TASKS:
            if (run / name).is_file():
                shutil.copy2(run / name, out / name)
        if (run / "tb").is_dir():
            shutil.copytree(run / "tb", out / "tb")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("src", type=Path)
    p.add_argument("dst", type=Path)
    p.add_argument("--tasks", type=int, default=None, help="copy each run as it stood after its first N tasks")
    args = p.parse_args()
    try:
        copied = collect(args.src, args.dst, args.tasks)
    except ValueError as e:
        print(f"collect_runs: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    for out in copied:
        print(out)


if __name__ == "__main__":
    main()

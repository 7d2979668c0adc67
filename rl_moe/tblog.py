"""TensorBoard logging that keeps every tag's steps strictly increasing.

Two things broke that before: callbacks that dump SB3's shared logger also wrote whatever an
update had left pending (so ``train/*`` appeared twice at one step), and a resumed run logged
the redone range again in a second events file. :func:`dump_keys` writes only the caller's own
tags; a resume first rewrites the folder's events without the range it trains again
(:func:`truncate_events`), so no file ever steps back and readers have nothing to purge.
Folders written before that used TensorBoard's ``purge_step``; :func:`quiet_tensorboard` reads
them without its "out of order" warnings.
"""

from __future__ import annotations

from collections.abc import Iterable
import logging
import os
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from stable_baselines3.common.logger import Logger, TensorBoardOutputFormat
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.backend.event_processing.event_file_loader import LegacyEventFileLoader
from tensorboard.summary.writer.event_file_writer import EventFileWriter
from torch.utils.tensorboard import SummaryWriter


def dump_keys(logger: Logger, keys: Iterable[str], step: int) -> None:
    """Dump only ``keys`` at ``step``; every other pending value stays pending for its owner."""
    wanted = set(keys)
    held = {k: (v, logger.name_to_excluded.get(k)) for k, v in logger.name_to_value.items() if k not in wanted}
    for k in held:
        logger.name_to_value.pop(k)
        logger.name_to_excluded.pop(k, None)
        logger.name_to_count.pop(k, None)
    try:
        logger.dump(step)
    finally:
        for k, (v, excluded) in held.items():
            logger.name_to_value[k] = v
            logger.name_to_excluded[k] = excluded  # type: ignore[assignment]


class _ResumingTensorBoard(TensorBoardOutputFormat):
    """SB3's TensorBoard writer, opened at its first write. A resumed run's writer first drops the
    range it trains again from the folder's events (:func:`truncate_events`), so a resume that
    fails before it logs anything leaves the files as they were."""

    def __init__(self, folder: str, truncate_at: int | None) -> None:
        self.folder, self.truncate_at = folder, truncate_at
        self._writer: SummaryWriter | None = None
        self._is_closed = False

    @property
    def writer(self) -> SummaryWriter:  # type: ignore[override]  # SB3 assigns it in __init__
        if self._writer is None:
            if self.truncate_at is not None:
                truncate_events(self.folder, self.truncate_at)
            self._writer = SummaryWriter(log_dir=self.folder)
        return self._writer

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        self._is_closed = True


def tensorboard_logger(folder: str, truncate_at: int | None = None) -> Logger:
    """An SB3 logger writing TensorBoard events to ``folder``.

    :param truncate_at: a resumed run's first step: the folder's events at steps >= this one
        (the range the resume trains again) are dropped before the first write; None for a new run
    """
    return Logger(folder=folder, output_formats=[_ResumingTensorBoard(folder, truncate_at)])


_REWRITE = ".rewrite"
_DONE = "done"


def _event_files(folder: Path) -> list[Path]:
    return sorted(folder.glob("events.out.tfevents.*"))


def _finish_rewrite(folder: Path) -> None:
    """Complete or drop an interrupted :func:`truncate_events`: a finished rewrite (marked done)
    replaces the old files; an unfinished one is discarded and the old files stay."""
    tmp = folder / _REWRITE
    if not tmp.is_dir():
        return
    if (tmp / _DONE).is_file():
        # Readers take files in name order: the new file must sort before every file the resumed
        # run writes (see _earlier_name).
        name = (tmp / _DONE).read_text().strip()
        for old in _event_files(folder):
            old.unlink()
        for new in _event_files(tmp):
            os.replace(new, folder / (name or new.name))
    shutil.rmtree(tmp)


def _earlier_name(name: str) -> str:
    """``name`` (``events.out.tfevents.<time>.<host>.<pid>.<n>``) with its time at least one second
    before now: a writer opened from now on names its file with a later time, so it sorts after
    whatever the host, pid and counter fields hold (those compare as text, "10" before "9")."""
    parts = name.split(".")
    if len(parts) < 4 or not parts[3].isdigit():
        return name
    parts[3] = f"{min(int(parts[3]), int(time.time()) - 1):010d}"
    return ".".join(parts)


def truncate_events(folder: str, step: int) -> None:
    """Rewrite the event files of ``folder`` as one file holding only the events before ``step``
    (a resume trains and logs that range again). Crash-safe: the new file is written aside, marked
    done, then swapped in; a rerun completes or discards an interrupted rewrite."""
    root = Path(folder)
    _finish_rewrite(root)
    files = _event_files(root)
    if not files:
        return
    tmp = root / _REWRITE
    tmp.mkdir()
    writer = EventFileWriter(str(tmp))
    for f in files:
        for event in LegacyEventFileLoader(str(f)).Load():  # as written: EventFileLoader converts scalars to tensors
            if not event.HasField("file_version") and event.step < step:
                writer.add_event(event)
    writer.close()
    (tmp / _DONE).write_text(_earlier_name(files[0].name))
    _finish_rewrite(root)


@contextmanager
def quiet_tensorboard() -> Iterator[None]:
    """Silence TensorBoard's reader warnings (the purge of folders written by older versions)."""
    log = logging.getLogger("tensorboard")
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        log.setLevel(level)


def logged_at(folder: str, tag: str, step: int) -> bool:
    """Whether the event files in ``folder`` hold ``tag`` at exactly ``step`` (read before a resumed
    run opens its writer; a point at a step below the purge step stays visible)."""

    if not any(Path(folder).glob("events.*")):
        return False

    acc = EventAccumulator(folder, size_guidance={"scalars": 0})
    with quiet_tensorboard():
        acc.Reload()
    return tag in acc.Tags()["scalars"] and any(e.step == step for e in acc.Scalars(tag))

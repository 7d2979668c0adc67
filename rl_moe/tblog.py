"""TensorBoard logging that keeps every tag's steps strictly increasing.

Two things broke that before: callbacks that dump SB3's shared logger also wrote whatever an
update had left pending (so ``train/*`` appeared twice at one step), and a resumed run logged
the redone range again in a second events file. :func:`dump_keys` writes only the caller's own
tags; :func:`tensorboard_logger` opens the writer with TensorBoard's ``purge_step``, which hides
every earlier event at or after the step a resume restarts from.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from stable_baselines3.common.logger import Logger, TensorBoardOutputFormat
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
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


class _PurgingTensorBoard(TensorBoardOutputFormat):
    """SB3's TensorBoard writer, opened with ``purge_step``."""

    def __init__(self, folder: str, purge_step: int | None) -> None:
        self.writer = SummaryWriter(log_dir=folder, purge_step=purge_step)
        self._is_closed = False


def tensorboard_logger(folder: str, purge_step: int | None = None) -> Logger:
    """An SB3 logger writing TensorBoard events to ``folder``.

    :param purge_step: a resumed run's first step: TensorBoard then hides the earlier files'
        events at steps >= this one (the range the resume trains again); None for a new run
    """
    return Logger(folder=folder, output_formats=[_PurgingTensorBoard(folder, purge_step)])


def logged_at(folder: str, tag: str, step: int) -> bool:
    """Whether the event files in ``folder`` hold ``tag`` at exactly ``step`` (read before a resumed
    run opens its writer; a point at a step below the purge step stays visible)."""

    if not any(Path(folder).glob("events.*")):
        return False

    acc = EventAccumulator(folder, size_guidance={"scalars": 0})
    acc.Reload()
    return tag in acc.Tags()["scalars"] and any(e.step == step for e in acc.Scalars(tag))

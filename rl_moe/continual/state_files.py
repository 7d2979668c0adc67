"""Files a run folder keeps beside its checkpoints: integrity of an SB3 ``.zip``, and the
``torch.save`` dicts of regularizer and training state (written atomically, read with a one-line
error when damaged)."""

from __future__ import annotations

import zipfile
from pathlib import Path
from typing import Any

import torch

from rl_moe.atomic import write_atomic
from rl_moe.cli import reraise_interrupt


def checkpoint_ok(path: Path) -> bool:
    """An SB3 ``.zip`` whose members are intact (CRC-checked) and hold the policy weights."""
    if not zipfile.is_zipfile(path):
        return False
    try:
        with zipfile.ZipFile(path) as zf:
            return "data" in zf.namelist() and "policy.pth" in zf.namelist() and zf.testzip() is None
    except (zipfile.BadZipFile, OSError, EOFError):
        return False


def save_regularizer_state(path: Path, state: dict[str, Any]) -> None:
    """``torch.save`` to a temp file in the same folder, then ``os.replace`` it over ``path``."""

    write_atomic(path, lambda tmp: torch.save(state, tmp))


def load_torch_state(path: Path, what: str, key: str | None = None) -> dict[str, Any] | None:
    """A dict saved with ``torch.save``, or None when the file does not exist.

    :param what: the state's name in the error message (``training state``)
    :param key: an entry every such state holds, checked to tell it from another dict
    :raises ValueError: if the file is unreadable (truncated, or not such a state)
    """

    if not path.is_file():
        return None
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises several types for a damaged pickle/zip
        reraise_interrupt(exc)
        raise ValueError(f"unreadable {what} {str(path)!r} ({type(exc).__name__})") from None
    if not isinstance(state, dict) or (key is not None and key not in state):
        raise ValueError(f"unreadable {what} {str(path)!r} (not a saved {what})")
    return state


def load_regularizer_state(path: Path) -> dict[str, Any] | None:
    """The saved regularizer state, or None when the file does not exist.

    :raises ValueError: if the file is unreadable (truncated, or not a saved state dict)
    """
    return load_torch_state(path, "regularizer state")

"""Files replaced atomically: a reader never sees a half-written file, and once a write returns the
file survives a kill (run folders' results, configs, checkpoints and saved states)."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any


def _default_mode() -> int:
    """The mode ``open()`` gives a new file (0666 less the umask); ``mkstemp`` would give 0600."""
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def _replace_atomically(path: Path, write: Callable[[str], None]) -> None:
    """``write(tmp)`` to a temp file in ``path``'s folder, flush it to disk, then ``os.replace`` it
    over ``path``: a reader never sees a half-written file, and once this returns the file
    survives a kill (or a power cut, up to the file system's guarantees)."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        write(tmp)
        os.chmod(tmp, _default_mode())
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def write_json_atomic(path: str | Path, data: Any) -> None:
    """Write JSON to a temp file in the same folder, then ``os.replace`` it over ``path``."""

    def write(tmp: str) -> None:
        with open(tmp, "w") as fh:
            json.dump(data, fh, indent=2)
            fh.write("\n")

    _replace_atomically(Path(path), write)


def write_atomic(path: str | Path, write: Callable[[str], None]) -> None:
    """``write(tmp)`` (any writer taking a file name), then atomically move it to ``path``."""
    _replace_atomically(Path(path), write)

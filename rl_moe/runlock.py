"""One writer per run folder: an advisory OS lock on ``<run>/.lock`` (``flock``).

The kernel releases the lock when its process ends, however it ends (kill -9 included), so a
crashed run never leaves a stale lock: a file without a live lock holder is free. A run that ends
(finished, failed or stopped with Ctrl-C) removes the file; only a killed one leaves it behind,
free. The file holds the writer's PID, for the message a second writer gets. Where ``fcntl`` is
missing (Windows) no lock is taken.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import IO, NamedTuple

from rl_moe.rundir import RunDir

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]


class RunLocked(Exception):
    """Another live process holds the run folder's lock.

    :param path: the run folder
    :param pid: the holder's PID as written in the lock file (None if unreadable)
    """

    def __init__(self, path: Path, pid: int | None) -> None:
        holder = f"process {pid}" if pid is not None else "another process"
        super().__init__(f"run folder {str(path)!r} is in use by {holder}; wait for it to finish or stop it, or use another folder")
        self.path, self.pid = path, pid


def _read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def _same_file(fh: IO[str], path: Path) -> bool:
    """Whether ``path`` still names the file ``fh`` has open."""
    try:
        return os.stat(path).st_ino == os.fstat(fh.fileno()).st_ino
    except FileNotFoundError:
        return False


def _try_lock(fh: IO[str]) -> bool:
    try:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


class RunLock:
    """Holds ``<run>/.lock`` from :meth:`acquire` until :meth:`release` or the process ends.

    :param run_dir: an existing run folder
    """

    def __init__(self, run_dir: str | Path) -> None:
        self.run_dir = Path(run_dir)
        self._fh: IO[str] | None = None

    def acquire(self) -> RunLock:
        """Take the lock and write this PID; :class:`RunLocked` if a live process holds it."""
        if fcntl is None:
            return self
        path = RunDir(self.run_dir).lock
        while True:
            fh = open(path, "a+")  # noqa: SIM115 (held open for the process's life: the lock is the open file)
            if not _try_lock(fh):
                fh.close()
                raise RunLocked(self.run_dir, _read_pid(path))
            if _same_file(fh, path):
                break
            # A holder removed the file between our open and our lock: ours is an orphan inode.
            fh.close()
        fh.seek(0)
        fh.truncate()
        fh.write(f"{os.getpid()}\n")
        fh.flush()
        self._fh = fh
        return self

    def release(self) -> None:
        """Remove the file while still holding the lock, then unlock: a process that opened the
        old file meanwhile sees it is gone (:func:`_same_file`) and opens a new one."""
        if self._fh is not None:
            try:
                RunDir(self.run_dir).lock.unlink()
            except FileNotFoundError:
                pass
            fcntl.flock(self._fh.fileno(), fcntl.LOCK_UN)
            self._fh.close()
            self._fh = None


class Holder(NamedTuple):
    """The live process holding a run folder's lock (``pid`` None if the file is unreadable)."""

    pid: int | None


def lock_holder(run_dir: str | Path) -> Holder | None:
    """Who holds ``run_dir``'s lock, or None if the folder is free. Reads only: it probes with a
    shared lock, which a writer's exclusive lock refuses."""
    path = RunDir(run_dir).lock
    if fcntl is None or not path.is_file():
        return None
    with open(path) as fh:
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return Holder(_read_pid(path))
        fcntl.flock(fh.fileno(), fcntl.LOCK_UN)
    return None

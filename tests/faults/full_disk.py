"""The full-disk nemesis: a directory gets a small filesystem of its own (a tmpfs of a given
size), which the nemesis fills (a ballast file written until ENOSPC) and frees (the ballast
removed), as a broker's disk fills and an operator then makes room.

Why a tmpfs mounted on the directory itself: only the tables under it fill, not the machine's
disk that the rest of the cluster (and the other tests) write to, and mounting needs no image
file or loop device. Why a ballast: what fills the disk in production is other data; the
ballast stands for it, so freeing it gives back exactly the room it took and the tables are
never touched by the nemesis.

Invariants: what the directory held before the mount is what it holds when the mount begins
(copied in), and what it holds when the mount ends is what it holds afterwards on the disk below
(copied out, unless `keep=False`): a table that lived through the fault goes on living after it.
The mount always ends, whatever the test did (`__exit__`, and `unmount` is safe to call
twice). Copying out is exact only while nothing writes to the directory: end the mount with the
directory quiet (its replicas caught up, no producer on it).

Runs in the test's process, as root (mount needs it). Not thread-safe: one thread drives it.
"""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from types import TracebackType

from tests.faults.history import History

FAULT = "full-disk"
DEFAULT_SIZE_BYTES = 8 * 1024 * 1024  # room for a test's tables before the ballast fills it
BALLAST_NAME = ".full-disk-ballast"  # hidden: no Delta reader lists it as a table's file
_CHUNK_BYTES = 1024 * 1024
_PAGE_BYTES = 4096  # tmpfs hands out pages: the last ones go a page at a time


class FullDisk:
    """`path` on a tmpfs of `size_bytes` while the context lasts; `fill` and `free` inject and
    heal the fault, each recorded in `history` when one is given."""

    def __init__(self, path: str | Path, size_bytes: int = DEFAULT_SIZE_BYTES, *,
                 history: History | None = None, keep: bool = True) -> None:
        """`keep`: copy what the directory holds out to the disk below when the mount ends
        (else it goes with the tmpfs)."""
        self.path = Path(path)
        self.size_bytes = size_bytes
        self.history = history
        self.keep = keep
        self.mounted = False
        self.ballast_bytes = 0  # what the ballast holds while the disk is full, else 0

    @property
    def ballast(self) -> Path:
        return self.path / BALLAST_NAME

    def __enter__(self) -> FullDisk:
        self.mount()
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.unmount()

    def mount(self) -> None:
        """Mount the tmpfs on `path` (made if missing), with whatever it held copied in."""
        self.path.mkdir(parents=True, exist_ok=True)
        held = _copy_aside(self.path) if any(self.path.iterdir()) else None
        try:
            _run("mount", "-t", "tmpfs", "-o", f"size={self.size_bytes}", "tmpfs",
                 str(self.path))
            self.mounted = True
            if held is not None:
                shutil.copytree(held, self.path, dirs_exist_ok=True)
        except BaseException:
            self.unmount()
            raise
        finally:
            if held is not None:
                shutil.rmtree(held, ignore_errors=True)

    def fill(self, leave_bytes: int = 0) -> int:
        """Write the ballast until the filesystem refuses (ENOSPC), then give back
        `leave_bytes` (rounded down to whole pages) for a write that fits in part. Returns the
        ballast's size."""
        assert self.mounted, "fill needs the mount"
        descriptor = os.open(self.ballast, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            for chunk in (_CHUNK_BYTES, _PAGE_BYTES, 1):  # the last: not one more byte fits
                _write_until_full(descriptor, chunk)
        finally:
            os.close(descriptor)
        size = self.ballast.stat().st_size
        if leave_bytes:
            size -= min(size, leave_bytes // _PAGE_BYTES * _PAGE_BYTES)
            os.truncate(self.ballast, size)
        self.ballast_bytes = size
        if self.history is not None:
            self.history.fault(FAULT, {"path": str(self.path), "ballast_bytes": size,
                                       "free_bytes": self.free_bytes()})
        return size

    def free(self) -> None:
        """Remove the ballast: the room it took is back."""
        self.ballast.unlink(missing_ok=True)
        if self.ballast_bytes and self.history is not None:
            self.history.heal(FAULT, {"path": str(self.path), "free_bytes": self.free_bytes()})
        self.ballast_bytes = 0

    def free_bytes(self) -> int:
        """What the filesystem under `path` still takes."""
        stats = os.statvfs(self.path)
        return stats.f_bavail * stats.f_frsize

    def unmount(self) -> None:
        """Free the disk and end the mount, what it holds copied out first (`keep`). A mount
        still busy (a file held open) is detached lazily: it goes once the file is closed."""
        if not self.mounted:
            return
        self.free()
        held = _copy_aside(self.path) if self.keep else None
        try:
            try:
                _run("umount", str(self.path))
            except subprocess.CalledProcessError:
                _run("umount", "-l", str(self.path))
            self.mounted = False
            if held is not None:  # over what the mount hid: it is older
                for stale in self.path.iterdir():
                    if stale.is_dir() and not stale.is_symlink():
                        shutil.rmtree(stale)
                    else:
                        stale.unlink()
                shutil.copytree(held, self.path, dirs_exist_ok=True)
        finally:
            if held is not None:
                shutil.rmtree(held, ignore_errors=True)


def _write_until_full(descriptor: int, chunk_bytes: int) -> None:
    """Append `chunk_bytes` at a time until the filesystem says ENOSPC."""
    zeros = b"\0" * chunk_bytes
    while True:
        try:
            os.write(descriptor, zeros)
        except OSError as e:
            if e.errno != errno.ENOSPC:
                raise
            return


def _copy_aside(path: Path) -> Path:
    """A copy of what `path` holds, in a temporary directory of its own, the ballast left out."""
    aside = Path(tempfile.mkdtemp(prefix="full-disk-"))
    shutil.copytree(path, aside, dirs_exist_ok=True,
                    ignore=shutil.ignore_patterns(BALLAST_NAME))
    return aside


def _run(*command: str) -> None:
    subprocess.run(command, check=True, capture_output=True, text=True)

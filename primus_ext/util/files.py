"""Atomic file writes and directory locks.

A write goes to a temp file with a unique name (``mkstemp``) beside the target, then
``os.replace``: a crash or Ctrl-C mid-write leaves the previous file intact, and two
writers of the same file never share a temp file (the last rename wins, whole).

``lock_dir`` takes an exclusive ``fcntl.flock`` on ``DIR/.primus-ext.lock`` for as long
as the returned lock is held; a second holder fails at once instead of interleaving its
files with the first's. The kernel drops the lock when the process dies, so a killed run
leaves nothing to clean up.
"""
from __future__ import annotations

import errno
import os
import stat
import tempfile
from pathlib import Path

LOCK_NAME = ".primus-ext.lock"


_KINDS = ((stat.S_ISFIFO, "a named pipe"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def _special_kind(path: Path) -> str | None:
    """What ``path`` is when it exists and is neither a regular file nor a directory."""
    try:
        mode = path.stat().st_mode
    except OSError:
        return None
    return next((name for test, name in _KINDS if test(mode)), None)


def output_path(path: str | os.PathLike, what: str) -> Path:
    """``path`` as a file to write: refuses a directory, a special file (a device, a named
    pipe, a socket: the atomic rename would replace it) and a parent that is a file, with
    one error naming the setting (``what``); creates missing parent directories."""
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"{what}={str(path)!r} is a directory; give a file path "
                         f"(e.g. {str(path / 'out')!r})")
    kind = _special_kind(path)
    if kind:
        raise ValueError(f"{what}={str(path)!r} is {kind}; outputs are written only to "
                         "regular files or new paths")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise ValueError(f"{what}={str(path)!r}: a parent of it is a file, not a "
                         "directory") from None
    return path


def atomic_write_bytes(path: str | os.PathLike, data: bytes, what: str = "path") -> Path:
    """Write ``data`` to ``path`` atomically (``what`` names the setting in errors)."""
    path = output_path(path, what)
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as exc:
        raise _write_error(exc, path, what) from None
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)  # mkstemp creates 0600; a written file gets the usual mode
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        if os.path.exists(tmp):
            os.unlink(tmp)
        if isinstance(exc, OSError):
            raise _write_error(exc, path, what) from None
        raise
    return path


def _write_error(exc: OSError, path: Path, what: str) -> ValueError:
    """One error naming the setting and the path (not the temp file beside it)."""
    reason = exc.strerror or str(exc)
    if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOENT):
        reason = f"cannot write into {str(path.parent)!r} ({reason})"
    return ValueError(f"{what}={str(path)!r}: {reason}; nothing was written there")


def input_file(path: str | os.PathLike, what: str) -> Path:
    """``path`` as a file to read: one error naming the setting for a missing path, a
    directory and a special file (a named pipe would block the read forever)."""
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"{what}={str(path)!r} is a directory; give a file")
    kind = _special_kind(path)
    if kind:
        raise ValueError(f"{what}={str(path)!r} is {kind}; give a regular file")
    if not path.is_file():
        raise ValueError(f"{what}={str(path)!r}: no such file")
    return path


def atomic_write_text(path: str | os.PathLike, text: str, what: str = "path") -> Path:
    return atomic_write_bytes(path, text.encode(), what)


class DirLock:
    """An exclusive lock on a directory, held until ``release`` (or process exit)."""

    def __init__(self, directory: str | os.PathLike, what: str):
        import fcntl

        self.directory = Path(directory)
        if self.directory.exists() and not self.directory.is_dir():
            raise ValueError(f"{what}={str(self.directory)!r} is a file; it must be a "
                             "directory (or a path that does not exist yet)")
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
        except (FileExistsError, NotADirectoryError):
            raise ValueError(f"{what}={str(self.directory)!r}: a parent of it is a file, "
                             "not a directory") from None
        self.path = self.directory / LOCK_NAME
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            try:
                holder = os.pread(self._fd, 64, 0).decode(errors="replace").strip()
            finally:
                os.close(self._fd)
            who = f" (pid {holder})" if holder else ""
            raise ValueError(f"{what}={str(self.directory)!r} is in use by another "
                             f"run{who}; wait for it to finish or choose another "
                             f"{what}") from None
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, f"{os.getpid()}\n".encode(), 0)

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor releases the flock
            self._fd = None

    def __enter__(self) -> "DirLock":
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def capture_out(path: str | os.PathLike, data: dict, write: bool, summary: str) -> None:
    """A capture script's result: with ``write``, ``data`` as indented JSON written
    atomically to ``path`` (its folder made) and one line saying so; else the JSON on
    stdout."""
    import json
    import sys
    text = json.dumps(data, indent=1) + "\n"
    if not write:
        sys.stdout.write(text)
        return
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(str(path), text)
    print(f"wrote {path} ({summary})")


def lock_dir(directory: str | os.PathLike, what: str) -> DirLock:
    return DirLock(directory, what)


def check_outputs(files: dict, dirs: dict | None = None) -> None:
    """Refuse, before any work, an output file flag that names a directory, a special
    file or a path under a file, and an output directory flag that names a file."""
    for flag, value in files.items():
        if value:
            output_path(value, flag)
    for flag, value in (dirs or {}).items():
        if value and Path(value).exists() and not Path(value).is_dir():
            raise ValueError(f"{flag}={value!r} is a file; it must be a directory (or a "
                             "path that does not exist yet)")

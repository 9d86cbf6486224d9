"""Reading a small file that someone else may have planted: never block, never follow a link, never read much.

A FIFO would block ``open()`` until a writer comes, a symbolic link may lead to ``/dev/zero`` or to a
secret, a directory or a device is no request. The file is opened with ``O_NOFOLLOW | O_NONBLOCK``,
checked with ``fstat`` on the descriptor itself (so nothing can be swapped in between), and read up to
its cap.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path


class UnsafeFileError(OSError):
    """A file refused unread (not a regular file, too large) or unreadable; the message says why."""


def open_regular_file(path: Path, *, dir_fd: int | None = None) -> int:
    """A read-only descriptor of the regular file ``path`` (relative to the open folder ``dir_fd`` when given);
    UnsafeFileError naming the problem otherwise (FileNotFoundError passes through: a file that went away is no
    threat)."""
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    except FileNotFoundError:
        raise
    except OSError as error:
        raise UnsafeFileError(_open_problem(path, error)) from None
    mode = os.fstat(descriptor).st_mode
    if not stat.S_ISREG(mode):
        os.close(descriptor)
        raise UnsafeFileError(f"{file_type(mode)}, not a regular file: refused unread")
    return descriptor


def read_small_file(path: Path, max_bytes: int, *, dir_fd: int | None = None) -> bytes:
    """The bytes of the regular file ``path`` (at most ``max_bytes``; relative to ``dir_fd`` when given);
    UnsafeFileError naming the problem."""
    try:
        descriptor = open_regular_file(path, dir_fd=dir_fd)
    except FileNotFoundError as error:
        raise UnsafeFileError(_open_problem(path, error)) from None
    try:
        info = os.fstat(descriptor)
        if info.st_size > max_bytes:
            raise UnsafeFileError(f"{info.st_size} bytes, over the limit of {max_bytes}: refused unread")
        data = os.read(descriptor, max_bytes + 1)
    finally:
        os.close(descriptor)
    if len(data) > max_bytes:  # it grew after the fstat
        raise UnsafeFileError(f"more than {max_bytes} bytes: refused")
    return data


def special_file(path: Path) -> str | None:
    """What ``path`` is, in words, when it is there but is no regular file (a link is not followed: ``lstat``);
    None for a regular file or nothing. For a file that someone else opens by name (DuckDB): never blocks."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return None
    return None if stat.S_ISREG(mode) else file_type(mode)


def _open_problem(path: Path, error: OSError) -> str:
    if error.errno == errno.ELOOP:
        return "a symbolic link, not a regular file: refused unread"
    if error.errno == errno.ENXIO:
        return "a socket, not a regular file: refused unread"
    return f"cannot open: {error.strerror or error}"


def file_type(mode: int) -> str:
    """What kind of file ``mode`` (an ``st_mode``) describes, in words."""
    for test, name in (
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISLNK, "a symbolic link"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return name
    return "a regular file" if stat.S_ISREG(mode) else "a special file"

"""Committing a file to disk: whole or not at all, durable when the call returns.

Free of torch, so jobs that only write text or pictures do not pay for importing it.
"""

import ctypes
import hashlib
import os
from pathlib import Path

from .errors import UserError


def write_atomic(path, write) -> None:
    """Call write(f) on PATH.tmp in the same directory, fsync it, rename it over PATH, fsync the directory.

    A crash at any moment leaves either the old PATH or the new one, never a mix; on error the
    .tmp is removed, PATH is untouched, and a failed write (disk full) is one UserError line.
    """
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    out = None
    try:
        with open(tmp, "wb") as f:
            out = _DurableWriter(f)
            write(out)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        tmp.unlink(missing_ok=True)
        failed = e if isinstance(e, OSError) else getattr(out, "error", None)
        if failed is not None:
            raise UserError(f"could not write {path}: {failed.strerror or failed}; the previous file is untouched") from None
        raise
    fsync_path(path.parent)  # the rename lives in the directory entry: without this it can be lost on power failure


def fsync_path(path) -> None:
    """fsync a file or a directory by its name."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def sha256_file(path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


class _DurableWriter:
    """The .tmp file's write(), with two jobs.

    It remembers the OSError behind a failed write: torch.save reports one as a bare 'unexpected pos'
    RuntimeError, and the user needs to hear 'No space left on device'. And every WRITEBACK_BYTES it
    asks the kernel to start writing what it has (sync_file_range, Linux), so the disk works while
    torch serialises the rest and the final fsync has little left to wait for.
    """

    WRITEBACK_BYTES = 8 << 20

    def __init__(self, f):
        self.f, self.error = f, None
        self.written = self.flushed = 0

    def write(self, data):
        try:
            n = self.f.write(data)
        except OSError as e:
            self.error = self.error or e
            raise
        self.written += len(data)
        if self.written - self.flushed >= self.WRITEBACK_BYTES:
            self.f.flush()
            _start_writeback(self.f.fileno(), self.flushed, self.written - self.flushed)
            self.flushed = self.written
        return n

    def flush(self):
        self.f.flush()


def _load_sync_file_range():
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.sync_file_range
    except (OSError, AttributeError):  # not Linux: the final fsync does all the work
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_longlong, ctypes.c_longlong, ctypes.c_uint]
    return fn


_SYNC_FILE_RANGE = _load_sync_file_range()
_SYNC_FILE_RANGE_WRITE = 2  # start writeback of dirty pages in the range; do not wait


def _start_writeback(fd: int, offset: int, nbytes: int) -> None:
    if _SYNC_FILE_RANGE is not None:
        _SYNC_FILE_RANGE(fd, offset, nbytes, _SYNC_FILE_RANGE_WRITE)  # a hint: its failure costs only speed


def write_text_atomic(path, text: str) -> None:
    write_atomic(path, lambda f: f.write(text.encode("utf-8")))


def write_csv_atomic(path, columns, rows) -> None:
    """ROWS (dicts) as CSV with COLUMNS, in that order (other keys left out), written as write_text_atomic."""
    import csv
    import io

    out = io.StringIO()
    writer = csv.DictWriter(out, columns, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    write_text_atomic(path, out.getvalue())

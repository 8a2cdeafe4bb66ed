"""The --out folder: certify's lock on it, the manifest of what certify and its runs wrote there, and files
written whole or not at all.

certify deletes only what it wrote. After each run, and with the verdict, it lists every file and folder
under its own entries of OUT (OWN: the runs' folders, the certificates, the logs, the verdict) with each
file's size and mtime. A later certify on OUT deletes them only if every one is listed and unchanged; if any
is not, it names that one and deletes nothing. Two certify runs on one OUT would delete and overwrite each
other's files: while one holds OUT's lock, another is refused.
"""

import contextlib
import fcntl
import json
import os
import stat
import threading
from pathlib import Path

from . import processes
from .errors import CannotJudge

MARK = ".certify"  # certify made this folder; certify's lock, and the pid that holds it
MANIFEST = ".certify.files"  # what certify and its runs wrote here: {path: [size, mtime_ns], folder: null}
STRAIGHT = "straight.json"  # the straight run's command, settings and time (runs.Runs.reuse_straight)
OWN = ("straight", STRAIGHT, "stopped", "resumed", "resumed.first", "repaired", "control", "runs", "straight.log",
       "stopped.log", "resumed.log", "resumed.first.log", "repaired.log", "control.log", "verdict.json",
       "verdict.md", "parting.svg", "saves", "crash", "crash.json", "crash.md", "crash.svg")  # the last five: --crash
_held_locks = {}  # OUT: its MARK, open and locked until the process ends
_recording = threading.Lock()  # the runs of --jobs record their files from threads of their own


def cannot(path, error: OSError, doing: str = "write") -> CannotJudge:
    return CannotJudge(f"cannot {doing} {path}: {error.strerror or error}")


def claim(out: Path) -> None:
    """OUT locked for this process and emptied of what earlier certify runs wrote there, unchanged since.
    CannotJudge, deleting nothing, where another certify holds OUT or it holds a file certify did not write."""
    try:
        if out.exists() and not (out / MARK).exists() and any(out.iterdir()):
            raise CannotJudge(f"{out} holds files certify did not write: give a new or empty folder")
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise cannot(out, e) from None
    held = lock(out)
    listed, found = read_manifest(out), entries(out)
    strange = [name for name, now in found.items() if name not in listed or listed[name] != now]
    if strange:
        more = f" (and {len(strange) - 1} more)" if len(strange) > 1 else ""
        raise CannotJudge(f"{out / strange[0]}{more} was not {'made' if found[strange[0]] is None else 'written'} "
                          f"by certify, or changed since: move it out of {out}, or give another --out; nothing was "
                          "deleted")
    for name in sorted(found, key=lambda n: (found[n] is None, -n.count("/"))):  # files, then deepest folders
        path = out / name
        try:
            path.rmdir() if found[name] is None else path.unlink()
        except OSError as e:
            raise cannot(path, e, "remove") from None
    try:
        held.truncate(0)
        held.write(f"{os.getpid()}\n")
        held.flush()
    except OSError as e:
        raise cannot(out / MARK, e) from None


def lock(out: Path):
    """OUT's MARK, open and locked (flock) until this process ends; CannotJudge if another certify holds it."""
    path = out / MARK
    try:
        f = open(path, "a+")
    except OSError as e:
        raise cannot(path, e) from None
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.seek(0)
        holder = f.read().strip()
        f.close()
        raise CannotJudge(f"another certify{f' (pid {holder})' if holder.isdigit() else ''} is using {out}: "
                          "wait for it to end, or give another --out") from None
    except OSError as e:
        f.close()
        raise cannot(path, e, "lock") from None
    _held_locks[out] = f
    return f


def entries(out: Path) -> dict:
    """{path under OUT: [size, mtime_ns] of a file or a link, None of a folder} of everything under OWN."""
    found = {}

    def visit(path: Path) -> None:
        try:
            st = path.lstat()
            if not stat.S_ISDIR(st.st_mode):
                found[path.relative_to(out).as_posix()] = [st.st_size, st.st_mtime_ns]
                return
            found[path.relative_to(out).as_posix()] = None
            children = sorted(path.iterdir())
        except FileNotFoundError:
            return
        except OSError as e:
            raise cannot(path, e, "read") from None
        for child in children:
            visit(child)

    for name in OWN:
        visit(out / name)
    return found


def read_manifest(out: Path) -> dict:
    try:
        return json.loads((out / MANIFEST).read_text())["entries"]
    except (OSError, ValueError, KeyError, TypeError):
        return {}


def manifest_text(listed: dict) -> str:
    """The manifest's JSON, an entry a line."""
    lines = ",\n".join(f"{json.dumps(name)}: {json.dumps(value)}" for name, value in listed.items())
    return '{"entries": {\n' + lines + "\n}}\n"


def record(out: Path) -> None:
    """OUT's manifest brought up to date: every file and folder now under certify's own entries."""
    with _recording:
        write_atomic(out / MANIFEST, manifest_text(entries(out)))


def stage(path: Path, text: str) -> Path:
    """PATH.tmp holding TEXT, flushed and fsynced; removed again if that fails (CannotJudge naming PATH)."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
    except BaseException as e:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        if isinstance(e, OSError):
            raise cannot(path, e) from None
        raise
    return tmp


def fsync_folder(folder: Path) -> None:
    """The renames into FOLDER made durable: they live in its entries."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, text: str) -> None:
    """PATH holds TEXT whole or is as it was: PATH.tmp written, flushed, fsynced and renamed over it, then the
    folder fsynced; the .tmp removed on any failure (CannotJudge: cannot write PATH)."""
    publish_files({path: text})


def publish(out: Path, texts: dict) -> None:
    """TEXTS ({name in OUT: text}, the verdict's files) written with the manifest that lists them: all of
    them whole, or none of them changed."""
    publish_files({out / name: text for name, text in texts.items()}, manifest=out / MANIFEST)


def publish_files(texts: dict, manifest: Path | None = None) -> None:
    """Each of TEXTS ({path: text}) staged as a .tmp, then all renamed over their names, signals held back
    meanwhile; with MANIFEST, OUT's manifest listing them is staged and renamed with them. Any failure
    leaves every name as it was and no .tmp (CannotJudge naming the file)."""
    staged = {}
    try:
        for path, text in texts.items():
            staged[path] = stage(path, text)
        if manifest is not None:
            out = manifest.parent
            listed = entries(out)
            for path, tmp in staged.items():
                st = tmp.lstat()
                listed[path.relative_to(out).as_posix()] = [st.st_size, st.st_mtime_ns]  # a rename keeps both
            staged[manifest] = stage(manifest, manifest_text(listed))
        with processes.held():
            for path, tmp in staged.items():
                try:
                    os.replace(tmp, path)
                except OSError as e:
                    raise cannot(path, e) from None
        for folder in {path.parent for path in staged}:
            try:
                fsync_folder(folder)
            except OSError as e:
                raise cannot(folder, e) from None
    finally:
        for tmp in staged.values():
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)

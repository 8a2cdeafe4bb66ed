"""What a power loss can leave of a save: its file-system operations recorded, the states they allow enumerated.

In the spirit of ALICE (Pillai et al., OSDI'14). A SIGKILL keeps the page cache: every write the process
made survives it. A power loss keeps only what reached the disk, and file systems make few promises about
the rest. Here a save runs with the os calls it makes recorded (Recorder: open for writing, write, fsync of
a file or a directory, rename, unlink, mkdir, rmdir, rmtree), and crash_states() enumerates, after each
operation, the trees a crash there may leave under a conservative persistence model:

  - data written to a file and not fsynced since may be lost, or cut at a block boundary;
  - a create, rename, unlink, mkdir or rmdir not followed by an fsync of its directory may be undone;
  - every operation after the last one an fsync forces may persist or not, in any order: the states tried
    are all of them, none, each one left out, each one alone, and each write cut at each block boundary.

Paths outside the recorded root go through untouched and unrecorded, but for one thing: a file or folder
renamed into the root from outside it (fsspec's transactions write in the temp folder, then move the file
in: Lightning's checkpoints) is recorded as made at a name outside the tree (OUTSIDE, which no state shows),
written whole, fsynced if it was, then renamed to its name in the root.
"""

import builtins
import hashlib
import io
import os
import shutil
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

BLOCK = 4096
MAX_CUTS = 400  # per write: a torn file at this many lengths
DATA_OPS = ("write", "trunc")
OUTSIDE = "../outside"  # where a file renamed into the root was made: no relative path under the root


@dataclass
class Op:
    kind: str  # creat write trunc fsync rename unlink mkdir rmdir fsync_dir mark
    path: str = ""  # creat, rename (source), unlink, mkdir, rmdir, fsync_dir: relative to the root
    inode: int = -1  # creat, write, trunc, fsync
    offset: int = 0
    data: bytes = b""
    dest: str = ""  # rename
    label: str = ""  # mark: what was committed
    committed: dict = field(default_factory=dict)  # mark: the committed tree {relative path: bytes}
    t: int = 0  # when it was made (monotonic ns): the ranks' recordings of one save merge in this order
    step: int = 0  # the optimizer steps its process had done (certify --crash: which save it belongs to)

    @property
    def directory(self) -> str:
        """The directory whose entry this operation changes."""
        return os.path.dirname(self.dest if self.kind == "rename" else self.path)


class _RecordedFile:
    """A file opened for writing under the root: its writes are recorded, everything else passes through."""

    def __init__(self, recorder, f, inode):
        self._recorder, self._f, self._inode = recorder, f, inode

    def write(self, data):
        offset = self._f.tell()
        n = self._f.write(data)
        try:  # a text file's characters as the bytes its encoding writes
            raw = data.encode(self._f.encoding, self._f.errors or "strict") if isinstance(data, str) else bytes(data)
            self._recorder.add(Op("write", inode=self._inode, offset=offset, data=raw))
        except Exception as e:  # noqa: BLE001
            self._recorder.failed(e)
        return n

    def __getattr__(self, name):
        return getattr(self._f, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._f.close()


class Recorder:
    """Record the file-system operations under ROOT while in a `with` block; start() snapshots the tree."""

    def __init__(self, root, inode_base: int = 0):
        self.root = Path(root).resolve()
        self.ops: list[Op] = []
        self.initial = snapshot(self.root)  # {relative path: bytes}, and directories as None
        self.names = {p: i for i, p in enumerate(p for p, v in self.initial.items() if v is not None)}
        self.next_inode = len(self.names) + inode_base  # a rank's files apart from another rank's
        self.fds: dict[int, tuple] = {}  # fd -> ("file", inode) or ("dir", path)
        self.lock = threading.Lock()
        self.quiet = 0  # inside rmtree: its own unlinks are recorded already
        self.synced_outside = set()  # (device, inode) of the files outside the root fsynced

    def rel(self, path) -> str | None:
        try:
            p = Path(os.fsdecode(path))
            p = (p if p.is_absolute() else Path.cwd() / p).resolve()
            rel = str(p.relative_to(self.root))
            return "" if rel == "." else rel  # the root itself, as os.path.dirname names it
        except (ValueError, TypeError):
            return None

    def failed(self, error: Exception) -> None:
        """An event that could not be recorded: raised (the lab's own saves; certify's recorder notes it)."""
        raise error

    def add(self, op: Op) -> None:
        with self.lock:
            op.t = time.monotonic_ns()
            self.ops.append(op)

    def mark(self, label: str, *paths) -> None:
        """The caller was told that PATHS are committed: their bytes now are what must never be lost."""
        committed = {}
        for path in paths:
            committed.update({k: v for k, v in snapshot(self.root, self.rel(path)).items()})
        self.add(Op("mark", label=label, committed=committed))

    # --- the wrapped calls -------------------------------------------------------------------------

    def __enter__(self):
        self.saved = {name: getattr(os, name) for name in ("open", "close", "fsync", "replace", "rename", "unlink",
                                                           "mkdir", "rmdir")}
        self.saved_open, self.saved_rmtree = builtins.open, shutil.rmtree
        builtins.open = io.open = self._open
        os.open, os.close, os.fsync = self._os_open, self._os_close, self._fsync
        os.replace, os.rename = self._rename_as("replace"), self._rename_as("rename")
        os.unlink = os.remove = self._unlink
        os.mkdir, os.rmdir = self._mkdir, self._rmdir
        shutil.rmtree = self._rmtree
        return self

    # each does the real call, then records what it did under the root (not inside rmtree, whose unlinks
    # it records itself)

    def _open(self, file, mode="r", *args, **kwargs):
        rel = self.rel(file) if isinstance(file, (str, bytes, os.PathLike)) else None
        if rel is None or self.quiet or not any(c in mode for c in "wax+"):
            return self.saved_open(file, mode, *args, **kwargs)
        existed = rel in self.names
        f = self.saved_open(file, mode, *args, **kwargs)
        if existed and "w" in mode:
            self.add(Op("trunc", inode=self.names[rel]))
        elif not existed:
            self.names[rel] = inode = self.next_inode
            self.next_inode += 1
            self.add(Op("creat", path=rel, inode=inode))
        self.fds[f.fileno()] = ("file", self.names[rel])
        return _RecordedFile(self, f, self.names[rel])

    def _os_open(self, path, flags, *args, **kwargs):
        fd = self.saved["open"](path, flags, *args, **kwargs)
        rel = self.rel(path)
        if rel is not None and not self.quiet:
            self.fds[fd] = ("dir", rel) if os.path.isdir(path) else ("file", self.names.get(rel, -1), rel)
        return fd

    def _os_close(self, fd):
        self.fds.pop(fd, None)
        return self.saved["close"](fd)

    def _fsync(self, fd):
        self.saved["fsync"](fd)
        what = self.fds.get(fd)
        if what and what[0] == "dir":
            self.add(Op("fsync_dir", path=what[1]))
        elif what:  # a file another rank made is known here by its name only (merged() finds its inode)
            self.add(Op("fsync", inode=what[1], path=what[2] if len(what) > 2 and what[1] < 0 else ""))
        else:  # a file outside the root: durable if it is later renamed in (its inode goes with it)
            try:
                st = os.fstat(fd)
                self.synced_outside.add((st.st_dev, st.st_ino))
            except OSError:
                pass

    def _rename_as(self, name):
        def rename(src, dst, *args, **kwargs):
            self.saved[name](src, dst, *args, **kwargs)
            s, d = self.rel(src), self.rel(dst)
            if s is None and d is not None and not self.quiet:
                try:
                    s = self._made_outside(Path(os.fsdecode(dst)))
                except Exception as e:  # noqa: BLE001  (recorded as far as it went)
                    self.failed(e)
            if s is not None and d is not None and not self.quiet:
                self.add(Op("rename", path=s, dest=d))
                moved = {k: v for k, v in self.names.items() if k == s or k.startswith(s + "/")}
                for k in [k for k in self.names if k == d or k.startswith(d + "/")]:
                    del self.names[k]
                for k, v in moved.items():
                    del self.names[k]
                    self.names[d + k[len(s):]] = v
        return rename

    def _made_outside(self, dst: Path) -> str:
        """DST, just renamed into the root from outside it, recorded as made under OUTSIDE: each folder, each
        file created and written whole (and fsynced, where it was before the rename). Its name there."""
        made = f"{OUTSIDE}/{self.next_inode}"
        self.next_inode += 1
        for path in [dst, *sorted(dst.rglob("*"))] if dst.is_dir() else [dst]:
            name = made + str(path)[len(str(dst)):]
            if path.is_dir():
                self.add(Op("mkdir", path=name))
                continue
            self.names[name] = inode = self.next_inode
            self.next_inode += 1
            self.add(Op("creat", path=name, inode=inode))
            self.add(Op("write", inode=inode, offset=0, data=path.read_bytes()))
            st = path.stat()
            if (st.st_dev, st.st_ino) in self.synced_outside:
                self.add(Op("fsync", inode=inode))
        return made

    def _unlink(self, path, *args, **kwargs):
        self.saved["unlink"](path, *args, **kwargs)
        rel = self.rel(path) if not kwargs.get("dir_fd") else None
        if rel is not None and not self.quiet:
            self.add(Op("unlink", path=rel))
            self.names.pop(rel, None)

    def _mkdir(self, path, *args, **kwargs):
        self.saved["mkdir"](path, *args, **kwargs)
        rel = self.rel(path)
        if rel is not None and not self.quiet:
            self.add(Op("mkdir", path=rel))

    def _rmdir(self, path, *args, **kwargs):
        self.saved["rmdir"](path, *args, **kwargs)
        rel = self.rel(path) if not kwargs.get("dir_fd") else None
        if rel is not None and not self.quiet:
            self.add(Op("rmdir", path=rel))

    def _rmtree(self, path, *args, **kwargs):
        rel = self.rel(path)
        if rel is not None and not self.quiet and os.path.isdir(path):
            for top, dirs, files in os.walk(path, topdown=False):
                for f in files:
                    unlink_rel = self.rel(os.path.join(top, f))
                    self.add(Op("unlink", path=unlink_rel))
                    self.names.pop(unlink_rel, None)
                self.add(Op("rmdir", path=self.rel(top)))
        self.quiet += 1
        try:
            return self.saved_rmtree(path, *args, **kwargs)
        finally:
            self.quiet -= 1

    def __exit__(self, *exc):
        builtins.open = io.open = self.saved_open
        for name, fn in self.saved.items():
            setattr(os, name, fn)
        os.remove = self.saved["unlink"]
        shutil.rmtree = self.saved_rmtree


def snapshot(root: Path, under: str | None = None) -> dict:
    """{relative path: bytes} of every file under ROOT (or its path UNDER), and None for each directory."""
    start = root / under if under else root
    if start.is_file():
        return {under: start.read_bytes()}
    tree = {}
    for p in sorted(start.rglob("*")) if start.is_dir() else []:
        tree[str(p.relative_to(root))] = None if p.is_dir() else p.read_bytes()
    if under and start.is_dir():
        tree[under] = None
    return tree


def merged(initial: dict, recordings: list) -> list[Op]:
    """The operations of several processes' recordings of one save (the ranks'), in the order they were made;
    a file's fsync by a process that did not create it gets the file's inode, from its name at that moment."""
    ops = sorted((op for ops in recordings for op in coalesced(ops)), key=lambda op: op.t)
    names = {p: i for i, p in enumerate(p for p, v in initial.items() if v is not None)}  # as Recorder numbers them
    for op in ops:
        if op.kind == "creat":
            names[op.path] = op.inode
        elif op.kind == "rename":
            for k in [k for k in names if k == op.path or k.startswith(op.path + "/")]:
                names[op.dest + k[len(op.path):]] = names.pop(k)
        elif op.kind == "unlink":
            names.pop(op.path, None)
        elif op.kind == "fsync" and op.inode < 0:
            op.inode = names.get(op.path, -1)
    return ops


# --- the states a crash may leave ---------------------------------------------------------------


def coalesced(ops: list[Op]) -> list[Op]:
    """Consecutive writes that extend one another in one file as one write (a cut inside it is a variant)."""
    out = []
    for op in ops:
        last = out[-1] if out else None
        if (op.kind == "write" and last is not None and last.kind == "write" and last.inode == op.inode
                and last.offset + len(last.data) == op.offset):
            out[-1] = Op("write", inode=op.inode, offset=last.offset, data=last.data + op.data, t=last.t,
                         step=last.step)
        else:
            out.append(op)
    return out


def forced(ops: list[Op], k: int) -> list[bool]:
    """For each of the first K operations: whether an fsync among them makes it durable."""
    result = []
    for i, op in enumerate(ops[:k]):
        later = ops[i + 1:k]
        if op.kind in DATA_OPS:
            result.append(any(o.kind == "fsync" and o.inode == op.inode for o in later))
        elif op.kind == "mark" or op.kind in ("fsync", "fsync_dir"):
            result.append(True)
        else:
            result.append(any(o.kind == "fsync_dir" and o.path == op.directory for o in later))
    return result


def variants(unforced: list[int], ops: list[Op], max_cuts: int = MAX_CUTS):
    """(persisted subset, {write index: bytes kept}) of the operations no fsync forces."""
    every = frozenset(unforced)
    yield every, {}
    yield frozenset(), {}
    for u in unforced:
        yield every - {u}, {}
        yield frozenset({u}), {}
        if ops[u].kind == "write":  # cut at a block boundary: at each of them, or at MAX_CUTS spread evenly
            blocks = (len(ops[u].data) - 1) // BLOCK
            for b in sorted({round(j * blocks / max_cuts) for j in range(max_cuts + 1)} if blocks > max_cuts
                            else range(blocks + 1)):
                yield every, {u: b * BLOCK}


def materialize(initial: dict, ops: list[Op], persisted) -> dict:
    """The tree {relative path: bytes, directory: None} after the operations for which PERSISTED(i) gives
    True (or the number of bytes kept, for a cut write)."""
    names = {p: i for i, p in enumerate(p for p, v in initial.items() if v is not None)}
    data = {i: bytearray(initial[p]) for p, i in names.items()}
    dirs = {p for p, v in initial.items() if v is None}
    for i, op in enumerate(ops):
        keep = persisted(i)
        if keep is False or op.kind in ("mark", "fsync", "fsync_dir"):
            continue
        if op.kind == "write":
            chunk = op.data if keep is True else op.data[:keep]
            buf = data.setdefault(op.inode, bytearray())
            if len(buf) < op.offset:
                buf.extend(b"\0" * (op.offset - len(buf)))
            buf[op.offset:op.offset + len(chunk)] = chunk
        elif op.kind == "trunc":
            data[op.inode] = bytearray()
        elif op.kind == "creat":
            names[op.path] = op.inode
            data.setdefault(op.inode, bytearray())
        elif op.kind == "rename":
            moved = {k: v for k, v in names.items() if k == op.path or k.startswith(op.path + "/")}
            moved_dirs = {d for d in dirs if d == op.path or d.startswith(op.path + "/")}
            if not moved and not moved_dirs:
                continue  # its source was never persisted
            for k in [k for k in names if k == op.dest or k.startswith(op.dest + "/")]:
                del names[k]
            dirs -= {d for d in dirs if d == op.dest or d.startswith(op.dest + "/")}
            for k, v in moved.items():
                del names[k]
                names[op.dest + k[len(op.path):]] = v
            dirs = (dirs - moved_dirs) | {op.dest + d[len(op.path):] for d in moved_dirs}
        elif op.kind == "unlink":
            names.pop(op.path, None)
        elif op.kind == "mkdir":
            dirs.add(op.path)
        elif op.kind == "rmdir":
            dirs.discard(op.path)
    tree = {d: None for d in dirs}
    for p, i in names.items():  # a file whose directory is gone (or never persisted) is not reachable
        parent = os.path.dirname(p)
        if parent == "" or parent in dirs:
            tree[p] = bytes(data.get(i, b""))
    return {p: v for p, v in tree.items() if not p.startswith(OUTSIDE)}  # made outside: not in the tree


def crash_states(recorder: Recorder, latest_first: bool = False, max_cuts: int = MAX_CUTS):
    """(crash point, the committed trees so far, the tree) of every distinct state a crash may leave: after
    each operation, every variant of what the unforced operations left (LATEST_FIRST: the last crash points
    first, where a commit has been reported: what a control that looks for one failing state wants; MAX_CUTS:
    the lengths at most at which each write is cut)."""
    ops = coalesced(recorder.ops)
    seen = set()
    for k in reversed(range(len(ops) + 1)) if latest_first else range(len(ops) + 1):
        if k and ops[k - 1].kind in ("fsync", "fsync_dir"):
            continue  # the same states as just before it: what it forces was there already
        durable = forced(ops, k)
        unforced = [i for i in range(k) if not durable[i]]
        committed = [op for op in ops[:k] if op.kind == "mark"]
        for subset, cuts in variants(unforced, ops, max_cuts):
            def persisted(i, subset=subset, cuts=cuts):
                if i >= k:
                    return False
                if durable[i]:
                    return True
                return cuts.get(i, True) if i in subset else False
            tree = materialize(recorder.initial, ops, persisted)
            # a tree seen before a commit was reported is checked again after it: more must hold of it then
            key = hashlib.sha256(repr((len(committed), sorted((p, hashlib.sha256(v).hexdigest() if v is not None
                                                              else None) for p, v in tree.items()))).encode()).hexdigest()
            if key not in seen:
                seen.add(key)
                yield k, committed, tree


def write_tree(tree: dict, root: Path) -> None:
    """Make ROOT hold exactly TREE."""
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    for p in sorted(p for p, v in tree.items() if v is None):
        (root / p).mkdir(parents=True, exist_ok=True)
    for p, v in tree.items():
        if v is not None:
            (root / p).parent.mkdir(parents=True, exist_ok=True)
            (root / p).write_bytes(v)

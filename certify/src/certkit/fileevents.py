"""certify --crash's recorder, in the program's process: every file event under the run's folder as it happens
(opens for writing, writes, fsyncs of files and folders, renames, unlinks, mkdirs, and each torch.save and
safetensors save_file whole, whose writers bypass Python's open), each tagged with the optimizer steps done by
then, appended to saves.<pid>.jsonl and its data to saves.<pid>.bin, so that a SIGKILL leaves them. saves.py
(the orchestration) reads them back. Imports the standard library and crashstates only.
"""

import json
import os
import time
from pathlib import Path

from . import crashstates
from .crashstates import Op

INODES = 10 ** 6  # each process numbers its files from pid * INODES: no two processes' numbers meet


class SaveRecorder(crashstates.Recorder):
    """The file events under ROOT of one process, each appended to FOLDER/saves.<pid>.jsonl (its data to
    saves.<pid>.bin) as it happens, so a SIGKILL leaves them; STEP() gives the optimizer steps done. An error
    while recording goes to NOTE and never into the program."""

    def __init__(self, root, folder, step, note):
        super().__init__(root, inode_base=os.getpid() * INODES)
        Path(folder).mkdir(parents=True, exist_ok=True)
        name = Path(folder) / f"saves.{os.getpid()}"
        self.log, self.blob = open(f"{name}.jsonl", "w"), open(f"{name}.bin", "wb")
        self.step, self.note, self.written = step, note, 0

    def add(self, op: Op) -> None:
        try:
            with self.lock:
                op.t, op.step = time.monotonic_ns(), self.step()
                self.blob.write(op.data)
                self.blob.flush()
                row = {k: v for k, v in vars(op).items() if k not in ("data", "committed")}
                self.log.write(json.dumps({**row, "data": [self.written, len(op.data)]}) + "\n")
                self.log.flush()
                self.written += len(op.data)
        except Exception as e:  # noqa: BLE001  (the program's save goes on, unrecorded)
            self.note(f"the saves' file events ({type(e).__name__}: {e})")

    def failed(self, error: Exception) -> None:
        self.note(f"the saves' file events ({type(error).__name__}: {error})")

    def wrap(self, module, name: str, position: int) -> None:
        """MODULE.NAME, a writer whose file Python's open never sees (torch.save's zip writer, safetensors'),
        recorded whole once it returns: the file made or emptied, then one write of all its bytes (a crash
        inside it is that write torn). POSITION: where the file's path is among its arguments."""
        real = getattr(module, name)

        def save(*args, **kwargs):
            path = args[position] if len(args) > position else kwargs.get("f", kwargs.get("filename"))
            rel = self.rel(path) if isinstance(path, (str, os.PathLike)) else None
            if rel is None or self.quiet:
                return real(*args, **kwargs)
            existed = rel in self.names
            self.quiet += 1  # a writer that opens the file in Python (the legacy format) is not recorded twice
            try:
                result = real(*args, **kwargs)
            finally:
                self.quiet -= 1
            try:
                if existed:
                    self.add(Op("trunc", inode=self.names[rel]))
                else:
                    self.names[rel] = inode = self.next_inode
                    self.next_inode += 1
                    self.add(Op("creat", path=rel, inode=inode))
                self.add(Op("write", inode=self.names[rel], offset=0, data=Path(path).read_bytes()))
            except Exception as e:  # noqa: BLE001
                self.note(f"the saves' file events ({type(e).__name__}: {e})")
            return result

        save.__wrapped__ = real
        setattr(module, name, save)


def install(root: str, folder: str, step, note) -> SaveRecorder:
    """A SaveRecorder started in this process, with torch.save and (if installed) safetensors' save_file."""
    import importlib.util

    import torch

    recorder = SaveRecorder(root, folder, step, note).__enter__()
    recorder.wrap(torch, "save", 1)
    if importlib.util.find_spec("safetensors") is not None:
        import safetensors.torch

        recorder.wrap(safetensors.torch, "save_file", 1)
    return recorder

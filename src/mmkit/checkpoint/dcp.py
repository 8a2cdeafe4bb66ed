"""The resume state of a sharded (FSDP2) run: a directory of DCP shards, committed whole, read back safely.

No single process holds the full state, so each rank writes its shards with torch.distributed.checkpoint
(DCP). The directory holds the entries of mmkit.checkpoint.entries.ENTRIES, split in two:
  the DCP files (.metadata, __<rank>_0.distcp)  the "model" and "optimizer" entries, sharded
  resume.pth                                    every other entry, a manifest (sha256 of each DCP file)
                                                and the digests; written by rank 0 last
It is written under NAME.tmp and renamed only when every file and the directory are on disk, so a save
killed at any moment never leaves a directory that looks complete. DCP reshards on load: the same
directory continues on any number of ranks, or in one plain process.

DCP in torch 2.13 unpickles .metadata with pickle.load, and the non-tensor values of a state dict with
an unrestricted torch.load: either could run code from a crafted file. Both go through the allow-lists
below instead (weights_only for the values).
"""

import io
import os
import pickle
import shutil
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import DefaultLoadPlanner, FileSystemReader
from torch.distributed.checkpoint.metadata import StorageMeta
from torch.distributed.checkpoint.state_dict import get_state_dict, set_model_state_dict, set_state_dict

from ..atomic import fsync_path, sha256_file
from .files import digest, load_file
from ..errors import UserError
from ..failpoint import failpoint
from .entries import (ENTRIES, NAMES, adamw_state_refusal, check_types, groups_refusal, seal, sealed,
                     weights_refusal)

META = "resume.pth"
SHARDED = tuple(e.name for e in ENTRIES if e.sharded)  # the entries that live in the DCP files
META_KEYS = tuple(k for k in NAMES if k not in SHARDED) + ("manifest",)


# --- saving -----------------------------------------------------------------------------------


class PendingSave:
    """A resume directory being written; commit() makes it the real one (after an async save finishes)."""

    def __init__(self, path, entries: dict, ranks, future=None):
        self.path, self.entries, self.ranks, self.future = Path(path), entries, ranks, future

    def writing(self) -> bool:
        return self.future is not None and not self.future.done()

    def wait(self) -> None:
        if self.future is not None:
            self.future.result()  # the background writes are done on this rank
            self.future = None

    def commit(self) -> None:
        self.wait()
        failpoint("save")
        self.ranks.barrier()  # ... and on every rank
        if self.ranks.main:
            _commit(_tmp(self.path), self.path, self.entries)
        self.ranks.barrier(after_save=True)  # no rank goes on before the directory is committed


def save_resume_dir(state: dict, path, ranks, async_save: bool = False) -> PendingSave:
    """Write STATE (resume_state's dict, model and optimizer as this rank's shards) under PATH.tmp.

    Returns a PendingSave: commit() it. With async_save the shards are written in the background, on a
    process group of their own (ranks.save_group), and commit() first waits for them.
    """
    tmp = _tmp(path)
    if ranks.main:
        recover(path)  # a swap onto this name that a kill interrupted: finished or undone, never lost
        if tmp.exists():
            shutil.rmtree(tmp)  # what a killed save left behind, not complete
    ranks.barrier()
    shards = {k: state[k] for k in SHARDED}
    entries = {k: v for k, v in state.items() if k not in SHARDED}
    if async_save:
        future = dcp.async_save(shards, checkpoint_id=str(tmp), process_group=ranks.save_group())
        return PendingSave(path, entries, ranks, future)
    dcp.save(shards, checkpoint_id=str(tmp))
    return PendingSave(path, entries, ranks)


def _tmp(path) -> Path:
    path = Path(path)
    return path.with_name(path.name + ".tmp")


def _old(path) -> Path:
    path = Path(path)
    return path.with_name(path.name + ".old")


def recover(path) -> str | None:
    """What a kill between _commit's two renames left of PATH, made whole again: with PATH gone, a complete,
    sealed PATH.tmp (every shard its manifest names, unchanged) is renamed onto the name, else PATH.old (the
    committed copy) is put back. Nothing committed is deleted unread. Returns what was done, or None."""
    path, tmp, old = Path(path), _tmp(path), _old(path)
    if path.exists() or not (tmp.is_dir() or old.is_dir()):
        return None  # the swap got past its second rename: what is left is stale, and goes with the leftovers
    try:
        read_resume_dir(tmp)
        done = f"{path.name}: a save killed before its rename was complete, and is committed now"
        os.rename(tmp, path)
    except UserError:
        if not old.is_dir():
            return None
        done = f"{path.name}: a save killed before its rename was not complete; the committed copy is back"
        os.rename(old, path)
    fsync_path(path.parent)
    return done


def _commit(tmp: Path, path: Path, entries: dict) -> None:
    manifest = {f.name: sha256_file(f) for f in sorted(tmp.iterdir())}
    meta = seal({**entries, "manifest": manifest})
    with open(tmp / META, "wb") as f:
        torch.save(meta, f)
    for f in tmp.iterdir():
        fsync_path(f)
    fsync_path(tmp)
    fsync_path(path.parent)  # the new directory's own entry: durable before the committed one moves aside
    if path.exists():  # a directory cannot be renamed over another: the old one goes aside first (recover())
        old = _old(path)
        shutil.rmtree(old, ignore_errors=True)
        os.rename(path, old)
        os.rename(tmp, path)
        shutil.rmtree(old)
    else:
        os.rename(tmp, path)
    fsync_path(path.parent)


# --- loading ----------------------------------------------------------------------------------


def read_resume_dir(path) -> dict:
    """resume.pth of a resume directory, with every DCP file the manifest lists present and unchanged."""
    path = Path(path)
    if not path.is_dir():
        raise UserError(f"resume directory {path} does not exist")
    meta = check_types(load_file(path / META, "resume directory's"), META_KEYS,
                       f"resume directory {path}: {META}")
    # the seal first: the manifest is trusted to name the shard files only once its own sha256 matches
    for k in sealed(meta):
        if digest(meta[k]) != meta["digests"].get(k):
            raise UserError(f"resume directory {path}: entry '{k}' does not match its recorded sha256")
    manifest = meta["manifest"]
    names = [n for n in manifest if isinstance(n, str) and n == Path(n).name and n not in ("", ".", "..", META)]
    if len(names) != len(manifest) or ".metadata" not in manifest or not all(
            isinstance(h, str) and len(h) == 64 for h in manifest.values()):
        raise UserError(f"resume directory {path}: entry 'manifest' must name each file of the directory "
                        "(.metadata among them, no path) with its 64-digit hex digest")
    for name in sorted(names):
        f = path / name
        if not f.is_file():
            raise UserError(f"resume directory {path}: shard file {name} is missing")
        if sha256_file(f) != manifest[name]:
            raise UserError(f"resume directory {path}: {name} does not match the sha256 recorded when it was "
                            "saved (truncated, damaged, or from another run)")
    # unpickled here, through the allow-list, so that a refusal is one line before DCP's collectives start
    # (inside dcp.load it would come back wrapped in every rank's traceback)
    with open(path / ".metadata", "rb") as f:
        metadata = read_metadata(f, f"resume directory {path}")
    check_dtypes(metadata, meta["fingerprint"].get("weights_dtype"), f"resume directory {path}")
    return meta


def check_dtypes(metadata, weights_dtype, source: str) -> None:
    """The shards' dtypes as .metadata records them: DCP would cast them into this run's tensors silently.
    Weights in the dtype the fingerprint names, AdamW's moments in fp32."""
    items = getattr(metadata, "state_dict_metadata", None)
    if not isinstance(items, dict):
        raise UserError(f"{source}: its .metadata lists no tensors")
    for fqn, item in items.items():
        dtype = getattr(getattr(item, "properties", None), "dtype", None)
        if dtype is None:  # a value stored as bytes (AdamW's hyperparameters)
            continue
        want = weights_dtype if fqn.startswith("model.") else "float32" if ".exp_avg" in fqn else None
        if want is not None and str(dtype).removeprefix("torch.") != want:
            entry = fqn.split(".")[0]
            raise UserError(f"{source}: entry '{entry}' tensor {fqn} is {dtype}, not {want}")


def load_sharded(path, model, optimizer, ranks, updates: int, load_optimizer: bool = True) -> None:
    """Load the directory's model and optimizer entries into MODEL and OPTIMIZER, however they are sharded,
    each shard checked as the file path checks whole tensors (UPDATES: AdamW's counter the resume implies).

    Loaded into copies first: a directory refused on any rank leaves every rank's live state as it was, and
    all of them refuse it. Works in a plain process too (no process group): the 2 -> 1 resharding path.
    """
    model_state, optimizer_state = get_state_dict(model, optimizer)  # the layout this run wants
    built_groups = optimizer_state["param_groups"]
    state = {"model": _copies(model_state)}
    if load_optimizer:
        state["optimizer"] = _copies(optimizer_state)
    try:
        dcp.load(state, storage_reader=_SafeReader(str(path)), planner=_SafeLoadPlanner(),
                 no_dist=not torch.distributed.is_initialized())
    except UserError:
        raise
    except Exception as e:  # a shard that does not fit this model: DCP's CheckpointException lists every rank's
        reason = str(e).strip().splitlines()
        raise UserError(f"resume directory {path} does not fit this run: "
                        f"{next((line.strip() for line in reversed(reason) if line.strip()), type(e).__name__)}") from None
    refusal = loaded_refusal(state, built_groups, updates)
    if ranks.any(refusal is not None):
        raise UserError(f"resume directory {path}: {refusal or 'another rank refused its shards'}")
    if load_optimizer:
        set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])
    else:
        set_model_state_dict(model, state["model"])


def _copies(tree):
    if isinstance(tree, torch.Tensor):
        return tree.detach().clone()
    if isinstance(tree, dict):
        return {k: _copies(v) for k, v in tree.items()}
    if isinstance(tree, list):
        return [_copies(v) for v in tree]
    return tree


def loaded_refusal(state: dict, built_groups: list, updates: int) -> str | None:
    """Why this rank's shards cannot be continued from (None: they can): the file path's checks of values
    (mmkit.checkpoint.entries), on this rank's shards."""
    refusal = weights_refusal(state["model"])
    if refusal or "optimizer" not in state:
        return refusal and f"entry 'model' {refusal}"
    groups, adamw = state["optimizer"].get("param_groups"), state["optimizer"].get("state")
    if not isinstance(groups, list) or not isinstance(adamw, dict):
        return f"entry 'optimizer' has not the {len(built_groups)} parameter groups of this run's AdamW"
    refusal = groups_refusal(groups, built_groups) or next(
        (r for fqn, entry in adamw.items() if (r := adamw_state_refusal(fqn, entry, updates))), None)
    return refusal and f"entry 'optimizer' {refusal}"


# .metadata's pickle may name only these: DCP's own metadata classes and the plain torch values inside them
_METADATA_GLOBALS = {
    "torch.distributed.checkpoint.metadata": {"Metadata", "TensorStorageMetadata", "BytesStorageMetadata",
                                              "ChunkStorageMetadata", "TensorProperties", "MetadataIndex",
                                              "StorageMeta", "_MEM_FORMAT_ENCODING"},
    "torch.distributed.checkpoint.filesystem": {"_StorageInfo"},
    "torch.serialization": {"_get_layout"},
    "torch": {"Size"},
    "pathlib": {"PosixPath", "PurePosixPath"},
    "collections": {"OrderedDict"},
}


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module, name):
        if name in _METADATA_GLOBALS.get(module, ()) or (
                module == "torch" and isinstance(getattr(torch, name, None), torch.dtype)):
            return super().find_class(module, name)
        raise UserError(f"its .metadata names {module}.{name}, which DCP metadata never holds; refusing to "
                        "unpickle it (that could run code)")


def read_metadata(stream, source: str):
    """DCP's .metadata from STREAM, unpickled through the allow-list: a refusal is one line naming SOURCE."""
    try:
        return _MetadataUnpickler(stream).load()
    except UserError as e:
        raise UserError(f"{source}: {e}") from None
    except Exception as e:
        raise UserError(f"{source}: its .metadata is not DCP metadata ({e})") from None


class _SafeReader(FileSystemReader):
    def read_metadata(self, *args, **kwargs):
        with self.fs.create_stream(self._get_metadata_path(kwargs.get("rank")), "rb") as f:
            metadata = read_metadata(f, f"resume directory {self.path}")
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


class _SafeLoadPlanner(DefaultLoadPlanner):
    """Non-tensor values (AdamW's lr, betas, ...) through torch.load(weights_only=True)."""

    def load_bytes(self, read_item, value: io.BytesIO) -> None:
        loaded = torch.load(value, weights_only=True)
        if self.flatten_state_dict:
            from torch.distributed.checkpoint._traverse import set_element

            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], loaded)
        else:
            self.state_dict[read_item.dest_index.fqn] = loaded

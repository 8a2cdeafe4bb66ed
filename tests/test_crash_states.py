"""Power loss, not just SIGKILL: every state a crash may leave of three saves, each continued from
(workflow/scripts/crash_states.py, certkit.crashstates), and the checker shown able to fail."""

import csv
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import run_script

from certkit.crashstates import Op, Recorder, crash_states, forced


def crash_check(tmp_path, *args) -> list[dict]:
    out = tmp_path / "states.csv"
    proc = run_script("crash_states.py", "--out-md", tmp_path / "states.md", "--out-csv", out, *args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return list(csv.DictReader(out.open()))


# every way a job saves, written out here rather than read from the script: a save dropped there fails here
SAVES = ["file", "dcp_resave", "prune", "async", "dcp", "dcp_2ranks", "rejected", "finish"]
COMMITTING = [s for s in SAVES if s != "finish"]  # a job's end commits nothing a crash could lose


# one process per save, so that a breakage of one is checked without the others; each write cut at 16
# lengths, not the report's 400: a torn file is torn at any of them
@pytest.mark.parametrize("save", SAVES)
def test_every_crash_state_of_every_save_continues_from_a_committed_checkpoint(tmp_path, save):
    """Catches: a save, a re-save's directory swap, a background save, a one- or two-rank DCP commit, a prune
    of this run's or of rejected checkpoints, or the job's final cleanup whose order of writes, fsyncs and
    renames lets a power loss tear a checkpoint, lose one reported committed, or leave a state auto-resume
    or --resume crashes on."""
    rows = crash_check(tmp_path, "--saves", save, "--cuts", "16")
    assert [r["save"] for r in rows] == [save]
    assert rows[0]["failures"] == "0", (tmp_path / "states.md").read_text()
    # it crashed at every step of the save: finish unlinks a checkpoint and the folder's mark, then the folder
    assert int(rows[0]["crash_points"]) >= (3 if save == "finish" else 4), rows
    assert int(rows[0]["states"]) > int(rows[0]["crash_points"]), rows  # more than one state per crash point


# each control's reason, in its own words: lost (a committed rename undone), torn (a committed name whose
# bytes are not those committed)
REASONS = {"lost": "its name is gone or holds the previous version",
           "torn": "its bytes on disk are not those committed"}


@pytest.mark.parametrize("control, found", [pytest.param("no-dir-fsync", "lost", marks=pytest.mark.slow),
                                            pytest.param("no-file-fsync", "torn", marks=pytest.mark.slow),
                                            ("no-fsync", "lost+torn")])
def test_each_control_fails_every_committing_save_for_its_own_reason(tmp_path, control, found):
    """Catches: a checker that cannot fail, or fails for the wrong reason: a persistence model that keeps
    every rename (SIGKILL's) finds nothing lost without the directory's fsync; one that keeps every write
    finds nothing torn without the file's, which is MiniMind's hazard; with neither, as MiniMind's
    lm_checkpoint saves, both must be found."""
    rows = crash_check(tmp_path, "--control", control)
    assert [r["save"] for r in rows] == COMMITTING
    assert [r["found"] for r in rows] == [found] * len(COMMITTING), rows
    report = (tmp_path / "states.md").read_text()
    for kind in found.split("+"):
        assert f": {kind}: continued from step" in report and REASONS[kind] in report, report


@pytest.mark.quick
def test_the_persistence_model_loses_what_no_fsync_made_durable():
    """The model itself, on operations written out by hand: a rename can persist without the data renamed
    (no fsync of the file), and a fsynced file can vanish with its rename (no fsync of the directory).
    Catches: a model that treats an fsync of the file as making its name durable, or drops no write."""
    initial = {"a": b"old"}
    unsynced = [Op("creat", path="a.tmp", inode=9), Op("write", inode=9, offset=0, data=b"new" * 2000),
                Op("rename", path="a.tmp", dest="a")]
    # crashed after the rename: nothing it did is durable, so each may or may not be on disk
    assert forced(unsynced, 3) == [False, False, False]
    trees = [tree for _, _, tree in crash_states(SimpleNamespace(ops=unsynced, initial=initial))]
    assert {"a": b"old"} in trees and {"a": b"new" * 2000} in trees
    assert {"a": b""} in trees  # the rename persisted, the data not: what MiniMind's pattern risks
    assert {"a": (b"new" * 2000)[:4096]} in trees  # cut at a block

    synced = unsynced[:2] + [Op("fsync", inode=9)] + unsynced[2:] + [Op("fsync_dir", path=""), Op("mark")]
    # the file's fsync makes its data durable, not its name; the directory's fsync makes the name durable
    assert forced(synced, 4)[:4] == [False, True, True, False] and forced(synced, 5)[:4] == [True, True, True, True]
    trees = [tree for k, _, tree in crash_states(SimpleNamespace(ops=synced, initial=initial))]
    assert {"a": b""} not in trees and not any(t.get("a") not in (b"old", b"new" * 2000) for t in trees)
    assert {"a": b"old"} in trees  # before the directory's fsync the rename may still be undone
    final = [tree for k, _, tree in crash_states(SimpleNamespace(ops=synced, initial=initial)) if k == len(synced)]
    assert final == [{"a": b"new" * 2000}]  # after it (and the commit reported), one state only


@pytest.mark.quick
def test_a_file_moved_in_from_outside_the_root_is_recorded_as_made_there_and_renamed_in(tmp_path):
    """fsspec's transaction (Lightning's checkpoints) writes a temp file outside the folder, then moves it in;
    other savers move a whole temp folder in. Catches: the move not recorded (certify --crash then saw no
    save of a Lightning run at all), the folder outside shown in a state, and an fsync made outside the root
    forgotten (a synced file read as losable)."""
    import os
    import tempfile

    root, outside = tmp_path / "run", Path(tempfile.mkdtemp(dir=tmp_path))
    root.mkdir()
    data = bytes(range(256)) * 40  # three blocks

    def moved_in(name: str, fsync: bool) -> list[dict]:
        with Recorder(root) as recorder:
            with open(outside / name, "wb") as f:
                f.write(data)
                if fsync:
                    f.flush()
                    os.fsync(f.fileno())
            os.replace(outside / name, root / name)
        return [tree for _, _, tree in crash_states(recorder)]

    trees = moved_in("last.ckpt", fsync=False)
    assert {} in trees and {"last.ckpt": data} in trees
    assert {"last.ckpt": b""} in trees  # renamed in, its unsynced data lost
    assert all(set(t) <= {"last.ckpt"} for t in trees), trees  # never the temp name, never a folder outside
    trees = moved_in("step=3.ckpt", fsync=True)
    before = {"last.ckpt": data, "step=3.ckpt": data}
    assert {"last.ckpt": data, "step=3.ckpt": data} in trees
    assert not any(t.get("step=3.ckpt") not in (None, data) for t in trees)  # synced: whole or absent

    (outside / "folder").mkdir()
    (outside / "folder" / "model.pt").write_bytes(data)
    with Recorder(root) as recorder:
        shutil.move(outside / "folder", root / "checkpoint-6")
    trees = [tree for _, _, tree in crash_states(recorder)]
    assert {**before, "checkpoint-6": None, "checkpoint-6/model.pt": data} in trees
    assert all(set(t) - set(before) <= {"checkpoint-6", "checkpoint-6/model.pt"} for t in trees), trees

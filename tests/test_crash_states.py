"""Power loss, not just SIGKILL: every state a crash may leave of three saves, each continued from
(workflow/scripts/crash_states.py, mmkit.crashstates), and the checker shown able to fail."""

import csv
from types import SimpleNamespace

import pytest
from conftest import run_script

from mmkit.crashstates import Op, crash_states, forced


def crash_check(tmp_path, *args) -> list[dict]:
    out = tmp_path / "states.csv"
    proc = run_script("crash_states.py", "--out-md", tmp_path / "states.md", "--out-csv", out, *args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return list(csv.DictReader(out.open()))


# one process per save, so that a breakage of one (the DCP commit's) is checked without the other two
@pytest.mark.parametrize("sequence", ["file", "dcp", "prune"])
def test_every_crash_state_of_a_save_a_dcp_commit_and_a_prune_continues_from_a_committed_checkpoint(tmp_path,
                                                                                                   sequence):
    """Catches: a save, a DCP directory commit or a prune whose order of writes, fsyncs and renames lets a
    power loss tear a checkpoint, lose one reported committed, or leave a state auto-resume crashes on."""
    rows = crash_check(tmp_path, "--sequences", sequence)
    assert [r["sequence"] for r in rows] == [sequence]
    assert rows[0]["failures"] == "0", rows
    assert int(rows[0]["crash_points"]) >= 4, rows  # it crashed at every step of its save
    assert int(rows[0]["states"]) >= 300, rows  # 350, 424 and 351 when written


@pytest.mark.parametrize("control, saves", [("no-dir-fsync", ["file", "dcp", "prune"]), ("no-fsync", ["file", "prune"])],
                         ids=["no-dir-fsync", "no-fsync"])
def test_the_checker_finds_failing_states_when_the_protocol_is_broken(tmp_path, control, saves):
    """Catches: a checker that cannot fail (a persistence model that keeps whatever was written, as SIGKILL
    does): without the directory's fsync, and MiniMind's .tmp + os.replace with no fsync at all, a commit
    reported done can be lost."""
    rows = crash_check(tmp_path, "--control", control)
    assert [r["sequence"] for r in rows] == saves
    assert all(int(r["failures"]) >= 1 for r in rows), rows


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

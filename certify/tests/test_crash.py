"""certify --crash through its command line, in real processes, on saver.py: one small training script
saving the ways people write saves, resuming by itself from what it finds. The expected outcomes come from
reading saver.py, not from a run of certify:

  replace  (no fsync) exact after any kill (the page cache survives it), but a power loss can leave
           ckpt.pt renamed in with its data lost: a resume that raises. With its fsyncs (durable) the same
           script passes both models: the contrast a kill-only tool cannot see.
  overwrite a kill inside torch.save's write leaves the only checkpoint torn: the resume raises.
  folders  a kill between model.pt and optim.pt leaves checkpoint-2/ without optim.pt, which the auto-resume
           takes (it is the highest number): the resume raises, FileNotFoundError.
  ddp_saver.py, 2 gloo ranks, Trainer's layout (rng_state_<rank>.pth per rank, here written in rank order;
           a missing one only warned about): a kill after rank 0's RNG file and before rank 1's resumes with
           rank 1's dropout stream unrestored: silent, rank 1, RNG (torch).
  pointer  a kill after ckpt-4.pt is whole but before latest.txt names it resumes from ckpt-2.pt: 2 steps
           lost, exact from there (and one after ckpt-2.pt, before latest.txt exists, starts from 0: 2 lost).

Each test names the breakage it catches. Each resumes about half its distinct states (--max-points, spread
evenly over them in the order the save reaches them): the states a claim needs come in runs of two or more
consecutive ones (a torn write and the clean cut beside it, every event between a checkpoint and the pointer
naming it), so every other one keeps at least one of each run, at half the resumes.
"""

import json
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

import pytest

SAVER = Path(__file__).parent / "saver.py"


def crash(tmp_path, save: str, stop_after: int, steps: int, model: str = "process", *options, command=None):
    """certify --crash on saver.py (under process crashes only, unless MODEL says otherwise: each resume is a
    process that imports torch, and the claims below but one are about kills)."""
    out = tmp_path / save
    command = command or ["python", SAVER, "--out", "{run}", "--save", save, "--steps", str(steps)]
    proc = subprocess.run([sys.executable, "-m", "certkit", "--crash", "--failure-model", model, *options, "--out", out,
                           "--stop-after", str(stop_after), "--", *command],
                          capture_output=True, text=True, timeout=900)
    found = json.loads((out / "crash.json").read_text()) if (out / "crash.json").exists() else None
    return proc, found


def outcomes(found, model: str) -> dict:
    """{outcome: count} of the points of MODEL (its torn variants included)."""
    return {o: n for o, n in found["counts"][model].items() if n}


def test_a_rename_without_fsync_survives_every_kill_but_not_a_power_loss(tmp_path):
    """Catches: a power-loss model that keeps what was never fsynced (replace would pass), a process-crash
    model that drops the page cache (replace would fail under it), a failing point without the command
    that rebuilds its state, a crash.svg that leaves out a point or paints it another outcome's colour, and
    --jobs 2 ending a run's processes when the one beside it ends (a kill is no exact resume), or not
    running two at once. (That a save with its fsyncs passes both models: run.py's test in tests/.)"""
    proc, found = crash(tmp_path, "replace", 2, 4, "both", "--max-points", "7", "--jobs", "2")  # of 13
    assert proc.returncode == 1, proc.stderr[-3000:]
    lines = [line for line in proc.stderr.splitlines() if line.startswith("[certify] crash/")]
    said = [line.split(": ")[0] for line in lines]
    assert said.index("[certify] crash/001 run started") < said.index("[certify] crash/000 run ended"), said
    assert not [line for line in lines if "run ended: killed by" in line], lines  # saver.py ends by itself
    assert set(outcomes(found, "process crash")) == {"exact"}, found["counts"]
    assert outcomes(found, "power loss").get("hard fail", 0) >= 1, found["counts"]
    failing = [p for p in found["points"] if p["outcome"] == "hard fail"]
    assert all(p["rebuild"].startswith(f"python -m certkit.saves {tmp_path / 'replace'} {p['state']} ") for p in failing)
    # crash.svg: every point once, in its outcome's colour as the picture's own legend gives it
    svg = "{http://www.w3.org/2000/svg}"
    picture = ET.parse(tmp_path / "replace" / "crash.svg").getroot()
    keys = list(picture.find(svg + "g[@id='legend']"))
    legend = {text.text: box.get("fill") for box, text in zip(keys[::2], keys[1::2])}
    shapes = list(picture)
    drawn = Counter((r.find(svg + "title").text, r.get("fill")) for r in shapes if r.find(svg + "title") is not None)
    assert drawn == Counter((f"after event {p['event']} ({p['what']}), {p['model']}: {p['outcome']}",
                             legend[p["outcome"]]) for p in found["points"]), drawn


@pytest.mark.slow
def test_a_torn_overwrite_of_the_only_checkpoint_is_a_hard_fail(tmp_path):
    """Catches: a process-crash model without torn writes (every kill would look clean), a resume that
    raises counted as anything but a hard fail, and a rerun into the same --out that keeps the earlier run's
    recorded saves (their events merged in: states of a save that never happened)."""
    proc, found = crash(tmp_path, "overwrite", 2, 4, "process", "--junit", tmp_path / "junit.xml")
    assert proc.returncode == 1, proc.stderr[-3000:]
    torn = [p for p in found["points"] if p["model"] == "process crash (torn)"]
    assert torn and all(p["outcome"] == "hard fail" for p in torn), torn
    # --junit: a testcase per crash point, the torn ones failing as hard fails (read with a JUnit layout reader)
    suite = ET.parse(tmp_path / "junit.xml").getroot().find("testsuite")
    failed = {c.get("name"): c.find("failure").get("message") for c in suite.findall("testcase")
              if c.find("failure") is not None}
    assert len(suite.findall("testcase")) == len(found["points"]) and int(suite.get("failures")) == len(failed)
    assert all(failed[f"process crash (torn): after event {p['event']} ({p['what']})"].startswith("hard fail: ")
               for p in torn), failed
    # again into the same --out (one point is enough: the events recorded are counted before any resume)
    again, refound = crash(tmp_path, "overwrite", 2, 4, "process", "--max-points", "1")
    assert refound is not None and again.returncode in (0, 1), again.stderr[-3000:]  # 0: the point it took is exact
    assert refound["events"] == found["events"] and len(list((tmp_path / "overwrite" / "saves").glob("*.jsonl"))) == 1


@pytest.mark.slow
def test_an_auto_resume_that_takes_a_newer_incomplete_folder_is_a_hard_fail_naming_the_missing_file(tmp_path):
    """Catches: completeness judged from a folder's existence, and a hard fail without its last line."""
    proc, found = crash(tmp_path, "folders", 2, 4, "process", "--max-points", "5")  # of 9
    assert proc.returncode == 1, proc.stderr[-3000:]
    killed = [p for p in found["points"] if p["model"] == "process crash" and p["outcome"] == "hard fail"]
    assert killed and any("optim.pt" in p["why"] for p in killed), found["points"]


@pytest.mark.slow
def test_a_resume_from_an_older_checkpoint_than_the_newest_complete_one_is_lost_work_of_two_steps(tmp_path):
    """Catches: a lost-work resume classified exact (it is exact from where it started), and the wrong
    number of steps lost."""
    proc, found = crash(tmp_path, "pointer", 4, 6, "process", "--max-points", "9")  # of 18
    assert proc.returncode == 1, proc.stderr[-3000:]
    lost = [p for p in found["points"] if p["outcome"] == "lost work"]
    # ckpt-2.pt whole before latest.txt exists: from step 0; ckpt-4.pt whole while latest.txt names ckpt-2.pt: from 2
    assert lost and all(p["lost"] == p["newest_complete"] - p["resumed_from"] == 2 for p in lost), lost
    assert any(p["model"] == "process crash" and (p["resumed_from"], p["newest_complete"]) == (2, 4)
               and p["exact_from_there"] for p in lost), lost


@pytest.mark.slow
def test_two_ranks_where_rank_1_dies_before_its_rng_file_resume_silently_naming_rank_1_and_its_rng(tmp_path):
    """Catches: one rank's file events lost or out of order (no state would lack rank 1's file alone), a
    silent resume reported without its first step, rank and piece, and a hard fail under torchrun reported
    by torchrun's closing banner instead of the error a rank raised."""
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    command = [*torchrun, Path(__file__).parent / "ddp_saver.py", "--out", "{run}"]
    proc, found = crash(tmp_path, "ddp", 2, 4, "process", "--max-points", "6", command=command)  # of 12
    assert proc.returncode == 1, proc.stderr[-3000:]
    silent = [p for p in found["points"] if p["outcome"] == "silent"]
    assert any(p["why"] == "first difference at step 3, rank 1: RNG (torch)" for p in silent), silent
    failed = [p["why"] for p in found["points"] if p["outcome"] == "hard fail"]
    assert failed and all(re.match(r"\[rank[01]\]: \w+Error: ", why) for why in failed), failed


def test_max_points_are_shared_between_the_failure_models_and_spread_within_each():
    """Catches: --max-points spread over every state at once, which gives a save of many files nearly all to
    power loss (Trainer's checkpoint, 817 states: 1 of 16 resumed was a process crash's), and a model that
    needs fewer than its share not passing the rest on. In-process: saves.sampled on made-up points."""
    from certkit import saves

    kills = [{"model": "process crash", "state": f"k{i}"} for i in range(40)]
    torn = [{"model": "process crash (torn)", "state": f"t{i}"} for i in range(10)]
    power = [{"model": "power loss", "state": f"p{i}"} for i in range(800)] + [{"model": "power loss", "state": "k0"}]
    chosen = saves.sampled(kills + torn + power, 16)
    assert len(set(chosen)) == len(chosen) == 16
    assert sum(s[0] in "kt" for s in chosen) == 8  # process crash, torn writes included: half of them
    assert {"k0", "t9", "p0", "p799"} <= set(chosen)  # evenly from first to last within each model
    few = saves.sampled(kills[:3] + power, 16)
    assert sorted(s for s in few if s[0] == "k") == ["k0", "k1", "k2"] and len(few) == 16

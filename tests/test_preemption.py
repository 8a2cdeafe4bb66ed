"""Surviving preemption: periodic checkpoints, auto-resume, SIGTERM/SIGUSR1, and chaos.

A training job is killed again and again, in compute at each distance from its newest checkpoint and
inside saves, and started again with the same command each time; it must end with the very bits and loss log of a run that was
never interrupted (and that wrote no periodic checkpoints at all). Every run is a separate process.
"""

import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import launch
import pytest
import torch
import yaml
from conftest import (CHECKPOINTED, NOT_COMPARED, SCRIPTS, TINY, assert_same_state_dict, clean_env, compare_builds,
                      copy_workflow, run_script, snakemake)

STEPS = 100
EVERY = 3
# per chaos test: every third kill inside a save, the others in compute at each distance from the newest
# checkpoint in turn (EVERY + 1 .. 1 steps past it). It was 20 kills at random distances, then 9, each
# distance twice: what the test proves needs each kind of kill, each distance, and each one surviving the
# kills before it.
KILLS = 6


def chaos_config(pipeline, tmp_path, name="c.yaml", **checkpoint) -> Path:
    cfg = yaml.safe_load((pipeline / "settings" / "straight.yaml").read_text())
    cfg["steps"] = STEPS
    cfg["checkpoint"] = {**cfg["checkpoint"], "every": EVERY, "keep": 2, **checkpoint}
    path = tmp_path / name
    path.write_text(yaml.safe_dump(cfg))
    return path


def train_cmd(config, pipeline, out: Path, checkpoints: Path | None):
    """run.py's arguments (started by start(), or after `torchrun ... run.py`)."""
    cmd = ["--config", str(config), "--tokens", str(pipeline / "data" / "train.npy"), "--out", str(out),
           "--loss-log", str(out.with_suffix(".csv"))]
    return cmd + (["--checkpoint-dir", str(checkpoints)] if checkpoints else [])


def start(cmd, env=None) -> launch.Started:
    return launch.Started(SCRIPTS / "run.py", cmd, env=env or clean_env())


def run(cmd, env=None):
    return start(cmd, env).finish()


@pytest.fixture(scope="module")
def uninterrupted(pipeline, tmp_path_factory):
    """The reference: STEPS steps in one process, without a checkpoint folder (so no periodic saves)."""
    tmp = tmp_path_factory.mktemp("uninterrupted")
    out = tmp / "ref.pth"
    proc = run(train_cmd(chaos_config(pipeline, tmp), pipeline, out, None))
    assert proc.returncode == 0, proc.stderr[-2000:]
    return out


def assert_same_as_uninterrupted(out: Path, ref: Path):
    assert_same_state_dict(torch.load(out, weights_only=True), torch.load(ref, weights_only=True))
    assert out.with_suffix(".csv").read_bytes() == ref.with_suffix(".csv").read_bytes()
    assert len(out.with_suffix(".csv").read_text().splitlines()) == STEPS + 1


def resumed_step(stderr: str) -> int:
    found = re.search(r"continuing from checkpoint \S+ \(step (\d+)\)", stderr)
    return int(found.group(1)) if found else 0


def killed_after_step(cmd, step: int, sig, env=None) -> tuple[int, str]:
    """Run CMD (run.py's arguments) and have it signalled by the failpoint after STEP's update, before that
    step's checkpoint: the signal lands at this very step, however loaded the machine, where a kill sent on
    reading the step's line lands some steps later."""
    name = "" if sig == signal.SIGKILL else f":{sig.name.removeprefix('SIG')}"
    proc = run(cmd, {**(env or clean_env()), "MMKIT_FAILPOINT": f"step{step}:0{name}"})
    return proc.returncode, proc.stderr


def signal_torchrun_after_step(cmd, step: int, sig, env) -> tuple[int, str]:
    """Start CMD (torchrun's command line) and send SIG to torchrun, which passes it on to its ranks, once a
    rank has reported STEP done: the ranks stop after that step or a later one (the tests assert no more)."""
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, env=env)
    lines = []
    for line in proc.stderr:
        lines.append(line)
        if line.startswith(f"step {step:>4}/"):
            proc.send_signal(sig)
            break
    lines += proc.stderr.readlines()
    return proc.wait(), "".join(lines)


def committed(checkpoints: Path) -> list[Path]:
    """The checkpoints committed to the folder, oldest first."""
    return sorted(checkpoints.glob("step_*.pth"))


def newest_checkpoint(checkpoints: Path) -> int:
    """The newest step committed to the folder."""
    return max([0] + [int(p.name[5:11]) for p in committed(checkpoints)])


def chaos(cmd, sig, checkpoints: Path) -> list[dict]:
    """Kill the job KILLS times, every third kill inside a save, restarting it after each; then let it finish."""
    kills, done, distances = [], 0, [EVERY + 1 - n % (EVERY + 1) for n in range(KILLS)]
    for i in range(KILLS):
        if i % 3 == 2:  # inside the first save this process makes: its bytes written, nothing renamed
            signame = "" if sig == signal.SIGKILL else f":{sig.name.removeprefix('SIG')}"
            proc = run(cmd, {**clean_env(), "MMKIT_FAILPOINT": f"save:0{signame}"})
            code, err, where = proc.returncode, proc.stderr, "save"
        else:  # in compute: 1 .. EVERY + 1 steps past the newest checkpoint (the last, past the next one)
            target = min(STEPS - 3, done + distances.pop(0))
            code, err = killed_after_step(cmd, target, sig)
            where = f"compute, after step {target}"
        assert code != 0, f"kill {i} ({where}) came too late: the job finished\n{err[-1500:]}"
        if sig != signal.SIGKILL:  # a noted signal: checkpoint after the step, then exit 75
            assert code == 75 and "preempted: " in err, err[-1500:]
        else:
            assert code == -signal.SIGKILL, err[-1500:]
        kills.append({"where": where, "resumed_from": resumed_step(err), "exit": code})
        done = newest_checkpoint(checkpoints)
    proc = run(cmd)
    assert proc.returncode == 0, proc.stderr[-2000:]
    kills.append({"where": "finished", "resumed_from": resumed_step(proc.stderr), "exit": 0})
    return kills


@pytest.mark.parametrize("sig", [signal.SIGKILL, pytest.param(signal.SIGTERM, marks=pytest.mark.slow)],
                         ids=["SIGKILL", "SIGTERM"])
def test_killed_again_and_again_it_ends_bit_identical_to_an_uninterrupted_run(pipeline, uninterrupted, tmp_path,
                                                                               sig):
    """Catches: a torn or half-committed checkpoint taken for whole, a resume from the wrong checkpoint, a
    data position, AdamW state or loss log that a restart loses or repeats, a signal that kills mid-save."""
    out, checkpoints = tmp_path / "job.pth", tmp_path / "checkpoints"
    cmd = train_cmd(chaos_config(pipeline, tmp_path), pipeline, out, checkpoints)
    kills = chaos(cmd, sig, checkpoints)
    in_save = sum(k["where"] == "save" for k in kills)
    resumed = [k["resumed_from"] for k in kills]
    print(f"\n{sig.name}: {len(kills) - 1} kills ({in_save} inside a save), each restart resumed from step "
          f"{resumed}; final weights and log bit-identical")
    assert len(kills) - 1 == KILLS and in_save == KILLS // 3
    # the restarts really resumed mid-run: every one after the first kill (at EVERY + 1, past a checkpoint)
    assert all(r > 0 for r in resumed[1:]), resumed
    assert_same_as_uninterrupted(out, uninterrupted)
    assert not checkpoints.exists()  # a finished job removes its folder (checkpoint.keep_when_done false)


def test_sigusr1_then_a_second_signal_during_the_save_checkpoints_once_and_whole(pipeline, uninterrupted,
                                                                                  tmp_path):
    """Catches: a second signal that interrupts the save, a USR1 that is not handled like TERM."""
    out, checkpoints = tmp_path / "job.pth", tmp_path / "checkpoints"
    cmd = train_cmd(chaos_config(pipeline, tmp_path, every=0), pipeline, out, checkpoints)
    proc = start(cmd)
    lines = []
    for line in proc.stderr:
        lines.append(line)
        if line.startswith("step    5/"):
            proc.send_signal(signal.SIGUSR1)
        if line.startswith("preemption: SIGUSR1 received"):
            proc.send_signal(signal.SIGTERM)
            proc.send_signal(signal.SIGUSR1)
    assert proc.wait() == 75, "".join(lines)
    saved = sorted(p.name for p in checkpoints.glob("step_*"))
    assert len(saved) == 1 and saved[0].endswith(".pth"), saved
    state = torch.load(checkpoints / saved[0], weights_only=True)
    # the step whose line we saw, or the next: the signal may land before that step's check
    assert state["step"] >= 5 and len(state["loss_log"]) == state["step"]
    proc = run(cmd)
    assert proc.returncode == 0 and resumed_step(proc.stderr) == state["step"], proc.stderr[-1500:]
    assert_same_as_uninterrupted(out, uninterrupted)


def test_keep_leaves_the_newest_checkpoints_and_keep_when_done_keeps_the_folder(pipeline, tmp_path):
    """Catches: pruning the newest instead of the oldest, pruning nothing, a folder removed against the config."""
    checkpoints = tmp_path / "checkpoints"
    cmd = train_cmd(chaos_config(pipeline, tmp_path, keep=3, keep_when_done=True), pipeline, tmp_path / "o.pth",
                    checkpoints)
    proc = run(cmd)
    assert proc.returncode == 0, proc.stderr[-1500:]
    last = (STEPS - 1) // EVERY * EVERY  # none after the last step: the weights file is written instead
    expected = [f"step_{s:06d}.pth" for s in (last - 2 * EVERY, last - EVERY, last)]
    assert sorted(p.name for p in checkpoints.glob("step_*")) == expected
    assert [torch.load(checkpoints / n, weights_only=True)["step"] for n in expected] == \
        [last - 2 * EVERY, last - EVERY, last]


def checkpoints_of(pipeline, tmp_path, config, stop: int) -> Path:
    """A folder holding the periodic checkpoints of CONFIG's run up to step STOP (killed after it, unsaved)."""
    checkpoints = tmp_path / f"ck-{config.stem}"
    code, err = killed_after_step(train_cmd(config, pipeline, tmp_path / f"{config.stem}.pth", checkpoints), stop,
                                  signal.SIGKILL)
    assert code == -signal.SIGKILL and checkpoints.is_dir(), err[-1500:]
    return checkpoints


def test_a_torn_newest_checkpoint_is_skipped_by_name_and_the_older_one_used(pipeline, uninterrupted, tmp_path):
    """Catches: a damaged checkpoint loaded (or crashing the job) instead of falling back to the older one."""
    config = chaos_config(pipeline, tmp_path)
    checkpoints = checkpoints_of(pipeline, tmp_path, config, 3 * EVERY + 1)
    older, newest = committed(checkpoints)[-2:]
    newest.write_bytes(newest.read_bytes()[: newest.stat().st_size // 2])
    out = tmp_path / "job.pth"
    proc = run(train_cmd(config, pipeline, out, checkpoints))
    assert proc.returncode == 0, proc.stderr[-1500:]
    warnings = [line for line in proc.stderr.splitlines() if line.startswith("warning: skipping checkpoint")]
    assert len(warnings) == 1 and str(newest) in warnings[0] and "truncated" in warnings[0], warnings
    assert resumed_step(proc.stderr) == int(older.stem.split("_")[1])
    assert_same_as_uninterrupted(out, uninterrupted)


def test_checkpoints_of_another_run_are_named_never_resumed_and_never_push_out_this_runs_own(pipeline, uninterrupted,
                                                                                            tmp_path):
    """Catches: a checkpoint of other settings resumed silently (a changed lr continuing a stale run); pruning
    that counts another run's checkpoints at higher steps among the newest `keep`, so that every checkpoint of
    this run is deleted as soon as it is committed and a kill starts it over."""
    other = yaml.safe_load(chaos_config(pipeline, tmp_path).read_text())
    other["lr"] *= 2
    (tmp_path / "other.yaml").write_text(yaml.safe_dump(other))
    checkpoints = checkpoints_of(pipeline, tmp_path, tmp_path / "other.yaml", 10 * EVERY + 1)
    foreign = committed(checkpoints)
    assert len(foreign) >= 2 and newest_checkpoint(checkpoints) > 3 * EVERY
    out = tmp_path / "job.pth"
    cmd = train_cmd(chaos_config(pipeline, tmp_path), pipeline, out, checkpoints)
    code, err = killed_after_step(cmd, 2 * EVERY + 1, signal.SIGKILL)
    assert code == -signal.SIGKILL, err[-1500:]
    warnings = [line for line in err.splitlines() if line.startswith("warning: skipping checkpoint")]
    assert len(warnings) == len(foreign) and all("lr " in w for w in warnings), warnings
    assert {str(p) for p in foreign} == {w.split()[3].rstrip(":") for w in warnings}
    assert resumed_step(err) == 0 and "step    1/" in err
    own = committed(checkpoints)
    assert own and not set(own) & set(foreign) and newest_checkpoint(checkpoints) >= 2 * EVERY, own
    removed = [line for line in err.splitlines() if line.startswith("checkpoints: removed")]
    assert len(removed) == 1 and all(p.name in removed[0] for p in foreign), removed
    proc = run(cmd)
    assert proc.returncode == 0, proc.stderr[-1500:]
    assert resumed_step(proc.stderr) == int(own[-1].stem.split("_")[1]), proc.stderr[-1500:]
    assert_same_as_uninterrupted(out, uninterrupted)


def test_a_resumed_ablation_never_takes_the_checkpoints_of_another_ablation(pipeline, tmp_path):
    """Catches: origin not compared, so noopt (same fingerprint as resumed) would continue resumed's run."""
    config = pipeline / "settings" / "resumed.yaml"
    common = ["--config", config, "--tokens", pipeline / "data" / "train.npy", "--resume", pipeline / "resume.pth"]
    checkpoints = tmp_path / "checkpoints"
    cfg = yaml.safe_load(config.read_text())
    cfg["checkpoint"] = {**cfg["checkpoint"], "every": 1, "keep_when_done": True}
    (tmp_path / "r.yaml").write_text(yaml.safe_dump(cfg))
    common[1] = tmp_path / "r.yaml"
    assert run_script("run.py", *common, "--out", tmp_path / "r.pth", "--checkpoint-dir", checkpoints).returncode == 0
    proc = run_script("run.py", *common, "--no-optim", "--out", tmp_path / "n.pth", "--loss-log", tmp_path / "n.csv",
                      "--checkpoint-dir", checkpoints)
    assert proc.returncode == 0, proc.stderr[-1500:]
    assert "is of another run" in proc.stderr and resumed_step(proc.stderr) == 0
    assert_same_state_dict(torch.load(tmp_path / "n.pth", weights_only=True),
                           torch.load(pipeline / "noopt.pth", weights_only=True))
    assert (tmp_path / "n.csv").read_bytes() == (pipeline / "noopt_log.csv").read_bytes()


def test_a_no_optim_job_killed_after_its_own_checkpoints_continues_from_them(pipeline, tmp_path):
    """Catches: a check of AdamW's counter against the step alone, which --no-optim's checkpoints (AdamW
    started afresh at the resume's step) never pass: every restart silently starts over from the --resume file."""
    cfg = yaml.safe_load((pipeline / "settings" / "resumed.yaml").read_text())
    cfg["checkpoint"] = {**cfg["checkpoint"], "every": 1, "keep": 2}
    (tmp_path / "n.yaml").write_text(yaml.safe_dump(cfg))
    checkpoints = tmp_path / "checkpoints"
    cmd = ["--config", tmp_path / "n.yaml", "--tokens", pipeline / "data" / "train.npy", "--resume",
           pipeline / "resume.pth", "--no-optim", "--out", tmp_path / "n.pth", "--loss-log", tmp_path / "n.csv",
           "--checkpoint-dir", checkpoints]
    killed_at = TINY["steps"] - 3
    proc = run_script("run.py", *cmd, env={**clean_env(), "MMKIT_FAILPOINT": f"step{killed_at}:0"})
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-1500:]
    assert committed(checkpoints)[-1].name == f"step_{killed_at - 1:06d}.pth"  # before that step's checkpoint
    proc = run_script("run.py", *cmd)
    assert proc.returncode == 0, proc.stderr[-1500:]
    assert "warning: skipping checkpoint" not in proc.stderr, proc.stderr[-1500:]
    assert resumed_step(proc.stderr) == killed_at - 1, proc.stderr[-1500:]
    assert_same_state_dict(torch.load(tmp_path / "n.pth", weights_only=True),
                           torch.load(pipeline / "noopt.pth", weights_only=True))
    assert (tmp_path / "n.csv").read_bytes() == (pipeline / "noopt_log.csv").read_bytes()


def test_a_job_removes_only_its_own_checkpoints_and_never_follows_a_symlink(pipeline, uninterrupted, tmp_path):
    """Catches: a finished job that deletes the whole folder it was given (the user's files in it), one that
    fails on a symlinked folder (rmtree refuses it) or follows a symlinked entry into another folder."""
    config = chaos_config(pipeline, tmp_path, keep=2)
    mine = tmp_path / "mine"  # a folder the user already had, holding the job's own output and notes
    mine.mkdir()
    (mine / "notes.txt").write_text("my notes")
    proc = run(train_cmd(config, pipeline, mine / "job.pth", mine))
    assert proc.returncode == 0, proc.stderr[-1500:]
    assert sorted(p.name for p in mine.iterdir()) == ["job.csv", "job.pth", "notes.txt"]
    assert_same_as_uninterrupted(mine / "job.pth", uninterrupted)
    # a symlinked folder, with a symlinked checkpoint of another run's inside: used, unlinked, never followed
    real, other = tmp_path / "real", tmp_path / "other"
    real.mkdir()
    other.mkdir()
    (other / "step_000050.pth").write_bytes(b"another folder's file")
    (real / f"step_{STEPS - 3:06d}.pth").symlink_to(other / "step_000050.pth")
    (tmp_path / "link").symlink_to(real)
    proc = run(train_cmd(config, pipeline, tmp_path / "o.pth", tmp_path / "link"))
    assert proc.returncode == 0, proc.stderr[-1500:]
    assert "warning: skipping checkpoint" in proc.stderr
    assert (tmp_path / "link").is_symlink() and list(real.iterdir()) == []
    assert (other / "step_000050.pth").read_bytes() == b"another folder's file"
    assert_same_as_uninterrupted(tmp_path / "o.pth", uninterrupted)


def test_a_checkpoint_dir_that_is_a_file_or_holds_a_stale_tmp_it_cannot_remove_is_one_line(pipeline, tmp_path,
                                                                                            small_disk):
    """Catches: a traceback (FileExistsError after training, PermissionError from the cleanup) instead of one
    line naming the folder, and training that runs before the folder is found unusable."""
    config = chaos_config(pipeline, tmp_path)
    (tmp_path / "a-file").write_text("not a folder")
    folder = small_disk / "checkpoints"
    folder.mkdir()
    (folder / "step_000003.pth.tmp").write_bytes(b"a save that never finished")
    subprocess.run(["mount", "-o", "remount,ro", str(small_disk)], check=True)
    try:
        for where, says in ((tmp_path / "a-file", "is a file, not a folder"),
                            (folder, "left by a save that never finished")):
            proc = run(train_cmd(config, pipeline, tmp_path / "o.pth", where))
            lines = proc.stderr.strip().splitlines()
            assert proc.returncode == 2 and says in lines[-1] and "Traceback" not in proc.stderr, proc.stderr[-1500:]
            assert not any(line.startswith("step ") for line in lines)
    finally:
        subprocess.run(["mount", "-o", "remount,rw", str(small_disk)], check=True)
    assert (tmp_path / "a-file").read_text() == "not a folder" and not (tmp_path / "o.pth").exists()


@pytest.fixture
def small_disk(tmp_path):
    """A 3 MB filesystem of its own (tmpfs; needs root, as CI has)."""
    where = tmp_path / "disk"
    where.mkdir()
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(where)], capture_output=True,
                          text=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {proc.stderr.strip()}")
    yield where
    subprocess.run(["umount", str(where)], check=True)


def test_a_full_disk_under_the_checkpoint_folder_is_one_error_and_the_last_checkpoint_stays(pipeline, tmp_path,
                                                                                            small_disk):
    """Catches: a failed checkpoint save that tracebacks, leaves a .tmp, or damages the previous checkpoint."""
    probe = tmp_path / "probe.pth"
    # the full disk below allows one checkpoint, so keep plays no part there
    config = chaos_config(pipeline, tmp_path)
    first = checkpoints_of(pipeline, tmp_path, config, EVERY + 1) / f"step_{EVERY:06d}.pth"
    size = first.stat().st_size
    shutil.copy(first, probe)
    filler = small_disk / "filler"
    filler.write_bytes(b"\0" * (3 * 2**20 - int(1.5 * size)))  # room for one checkpoint, not two
    checkpoints = small_disk / "checkpoints"
    proc = run(train_cmd(config, pipeline, tmp_path / "o.pth", checkpoints))
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode == 2 and len(errors) == 1 and "No space left on device" in errors[0], proc.stderr[-1500:]
    assert "Traceback" not in proc.stderr
    assert [p.name for p in checkpoints.glob("step_*")] == [f"step_{EVERY:06d}.pth"]  # no .tmp, the good one kept
    assert_same_state_dict(torch.load(checkpoints / f"step_{EVERY:06d}.pth", weights_only=True),
                           torch.load(probe, weights_only=True))
    assert not (tmp_path / "o.pth").exists()


# Each kill lands at a random moment 2 to 5 s into a restart: in the DAG's parse, a job's start, a
# training step or a save, with whatever outputs are incomplete then. Six were ten: the restarts after the
# sixth only repeat those moments, at 5 s of startup and unlock each.
SNAKEMAKE_KILLS = 6


@pytest.mark.slow
def test_snakemake_killed_again_and_again_and_rerun_incomplete_ends_with_the_clean_build_artifacts(pipeline,
                                                                                                   tmp_path):
    """Catches: an incomplete output taken as finished, a lock that blocks the restart, a training job that
    resumes a checkpoint wrongly after its Snakemake died, any artifact that differs from a clean build."""
    work = copy_workflow(tmp_path / "w")
    (work / "tiny.yaml").write_text(yaml.safe_dump(CHECKPOINTED))
    rng = random.Random("snakemake-chaos")
    kills = []
    while len(kills) < SNAKEMAKE_KILLS:
        if kills:
            snakemake(work, "--unlock")  # what a user types after a crash left the directory locked
        dag = subprocess.Popen([sys.executable, "-m", "snakemake", "--cores", "2", "--rerun-incomplete",
                                "--configfile", "config.yaml", "tiny.yaml"], cwd=work, env=clean_env(work / "src"),
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        delay = rng.uniform(2.0, 5.0)
        try:
            dag.wait(timeout=delay)
            pytest.fail(f"the DAG finished after {len(kills)} kills; kill sooner")
        except subprocess.TimeoutExpired:
            os.killpg(dag.pid, signal.SIGKILL)  # Snakemake and every job it started, mid-whatever
            dag.wait()
            kills.append(round(delay, 1))
    snakemake(work, "--unlock")
    proc = snakemake(work, "--rerun-incomplete")
    compared, differing = compare_builds(work / "results", pipeline, NOT_COMPARED)
    assert {"report.md", "resumed.pth", "noskip.pth", "inference/model.safetensors"} <= set(compared)
    print(f"\nsnakemake: {len(kills)} kills of the process group after {kills} s of each restart; "
          f"{len(compared)} artifacts compared, {len(differing)} differ")
    assert differing == [], proc.stderr[-2000:]



# the launcher the pipeline's multi-rank jobs use (workflow/rules/code.smk: launch): torchrun, which also
# passes SIGUSR1 on and exits 75 when its ranks were preempted
TORCHRUN = [sys.executable, str(SCRIPTS / "torchrun.py"), "--standalone", "--nproc-per-node", "2"]
DDP_ENV = {**clean_env(), "OMP_NUM_THREADS": "1"}
HANG_S = 40  # a 2-rank tiny job runs in seconds; its ranks' collectives wait a minute before they give up


@pytest.fixture(scope="module")
def ddp_job(pipeline, tmp_path_factory):
    """A 2-rank DDP chaos job: its config, and its reference weights (run through, no checkpoint folder)."""
    tmp = tmp_path_factory.mktemp("ddp")
    cfg = yaml.safe_load(chaos_config(pipeline, tmp).read_text())
    cfg["parallel"] = {**cfg["parallel"], "world_size": 2, "strategy": "ddp", "batch_slices": 2}
    (tmp / "ddp.yaml").write_text(yaml.safe_dump(cfg))
    ref = tmp / "ref.pth"
    proc = subprocess.run(ddp_cmd(tmp / "ddp.yaml", pipeline, ref, None), capture_output=True, text=True, env=DDP_ENV)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return tmp / "ddp.yaml", ref


def ddp_cmd(config, pipeline, out, checkpoints):
    return TORCHRUN + [str(SCRIPTS / "run.py"), *train_cmd(config, pipeline, out, checkpoints)]


@pytest.mark.parametrize("sig", [signal.SIGTERM, pytest.param(signal.SIGUSR1, marks=pytest.mark.slow)],
                         ids=["SIGTERM", "SIGUSR1"])
def test_a_signal_to_torchrun_checkpoints_every_ddp_rank_after_the_same_step_and_exits_75(pipeline, ddp_job,
                                                                                         tmp_path, sig):
    """Catches: ranks that stop after different steps (a hang, or a checkpoint of mismatched ranks), a
    preempted DDP job that does not continue bit-identically; a SIGUSR1 (SLURM's warning before a time limit)
    that kills torchrun instead of reaching the ranks; a preempted job's exit status lost (torchrun's 1)."""
    config, ref = ddp_job
    out, checkpoints = tmp_path / "job.pth", tmp_path / "checkpoints"
    cmd = ddp_cmd(config, pipeline, out, checkpoints)
    code, err = signal_torchrun_after_step(cmd, 2 * EVERY + 1, sig, DDP_ENV)  # to torchrun's process, which passes it on
    assert code == 75 and f"preempted: {sig.name} after step" in err, err[-2000:]
    stopped = newest_checkpoint(checkpoints)
    assert stopped >= 2 * EVERY + 1  # after the step whose line we saw (or the next), on both ranks alike
    proc = subprocess.run(cmd, capture_output=True, text=True, env=DDP_ENV)
    assert proc.returncode == 0 and resumed_step(proc.stderr) == stopped, proc.stderr[-2000:]
    assert_same_as_uninterrupted(out, ref)


def test_torchrun_exits_75_only_when_every_rank_was_preempted(pipeline, ddp_job, tmp_path):
    """Catches: a job reported preempted (75: retried, forever) although a rank died in its checkpoint."""
    cfg = yaml.safe_load(ddp_job[0].read_text())
    cfg["checkpoint"] = {**cfg["checkpoint"], "every": 0}  # the preemption's save is the first save
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
    cmd = ddp_cmd(tmp_path / "c.yaml", pipeline, tmp_path / "job.pth", tmp_path / "checkpoints")
    code, err = signal_torchrun_after_step(cmd, EVERY, signal.SIGTERM, {**DDP_ENV, "MMKIT_FAILPOINT": "save:0"})
    assert code not in (0, 75) and "torchrun: SIGTERM passed on to the ranks; rank 0 was not preempted" in err, \
        err[-2000:]
    assert not committed(tmp_path / "checkpoints")


def test_a_checkpoint_one_rank_refuses_is_skipped_by_every_rank(pipeline, ddp_job, tmp_path):
    """Catches: ranks that choose their checkpoint each on its own, so that one continues from step N and the
    other from an older one (a hang in the first collective, or ranks training different states)."""
    config, ref = ddp_job
    out, checkpoints = tmp_path / "job.pth", tmp_path / "checkpoints"
    cmd = ddp_cmd(config, pipeline, out, checkpoints)
    code, err = signal_torchrun_after_step(cmd, 2 * EVERY + 1, signal.SIGTERM, DDP_ENV)
    assert code == 75, err[-2000:]
    older, newest = committed(checkpoints)[-2:]
    env = {**DDP_ENV, "MMKIT_FAILPOINT": f"verdict-{newest.name}:1:REFUSE"}  # rank 1 alone refuses the newest
    # ranks that chose apart hang in their first collective (a minute, COLLECTIVE_TIMEOUT): this run takes
    # seconds, so a hang is called after HANG_S, not waited out
    log = tmp_path / "restart.log"  # a file: a pipe would wait for the hung ranks to close it
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=f, env=env)
    try:
        proc.wait(timeout=HANG_S)
    except subprocess.TimeoutExpired:
        subprocess.run(["pkill", "-KILL", "-P", str(proc.pid)])  # the ranks, which would wait on in their collective
        proc.kill()
        pytest.fail(f"the ranks hung for {HANG_S} s: they continued from different checkpoints\n"
                    f"{log.read_text()[-2000:]}")
    stderr = log.read_text()
    assert proc.returncode == 0, stderr[-2000:]
    assert f"warning: skipping checkpoint {newest}: refused by another rank" in stderr, stderr[-2000:]
    assert resumed_step(stderr) == int(older.stem.split("_")[1]), stderr[-2000:]
    assert_same_as_uninterrupted(out, ref)


def test_a_signal_before_the_first_step_still_ends_in_a_checkpoint_and_exit_75(pipeline, tmp_path):
    """Catches: handlers installed late (after the imports, or after the process group started), so that a
    signal at start kills the job unsaved; a handler that does more than note the signal."""
    out, checkpoints = tmp_path / "job.pth", tmp_path / "checkpoints"
    cmd = [sys.executable, str(SCRIPTS / "run.py"),
           *train_cmd(chaos_config(pipeline, tmp_path, every=0), pipeline, out, checkpoints)]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, env=clean_env())
    # as soon as the process catches SIGUSR1, or has begun to load torch without catching it (handlers
    # installed late): either way it is still importing torch (2 s or more of CPU), long before its process
    # group or first step. Events, not a clock: a loaded machine may take seconds to get there.
    while not (catches(proc.pid, signal.SIGUSR1) or maps_torch(proc.pid)):
        assert proc.poll() is None, proc.stderr.read()[-2000:]
        time.sleep(0.005)
    proc.send_signal(signal.SIGUSR1)
    err = proc.stderr.read()
    assert proc.wait() == 75 and "preempted: SIGUSR1 after step 1 " in err, err[-2000:]
    assert "step    2/" not in err and [p.name for p in committed(checkpoints)] == ["step_000001.pth"]


def maps_torch(pid: int) -> bool:
    """Whether process PID has begun to load torch's shared library."""
    return "libtorch" in Path(f"/proc/{pid}/maps").read_text()


def catches(pid: int, sig) -> bool:
    """Whether process PID has a handler for SIG (the SigCgt mask of /proc/PID/status)."""
    status = Path(f"/proc/{pid}/status").read_text()
    mask = int(next(line.split()[1] for line in status.splitlines() if line.startswith("SigCgt:")), 16)
    return bool(mask >> (sig - 1) & 1)

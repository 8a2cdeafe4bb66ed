"""Several ranks: dist/ built by torchrun jobs, compared tensor by tensor; damaged and malicious resume
directories; ranks killed mid-save and mid-step.

Each test names the breakage it catches.
"""

import csv
import math
import pickle
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import yaml
from conftest import (SCRIPTS, TINY, assert_same_state_dict, clean_env, differences, run_script, same_state_dict,
                      snakemake)

PAIRS_EXACT = {  # variant: the run it must equal bit for bit
    "ddp/resumed": "ddp/straight",
    "fsdp2/resumed": "fsdp2/straight",
    "reshard_2to1": "ddp/straight",
    "reshard_1to2": "ddp/straight",
}


@pytest.fixture(scope="session")
def build(pipeline):
    """build(*names): those dist/ targets made by snakemake in the tiny pipeline's folder (its tokens
    reused), each once per session; returns results/dist. A test builds only what it reads."""
    done = set()

    def build(*names):
        todo = [n for n in names if n not in done]
        if todo:
            snakemake(pipeline.parent, *(f"results/dist/{n}" for n in todo))
            done.update(todo)
        return pipeline / "dist"

    return build


@pytest.fixture(scope="session")
def dist(build) -> Path:
    """All of dist/ (snakemake dist)."""
    return build("divergence.csv")


def dist_settings(pipeline: Path, run: str) -> Path:
    """The settings file of dist/ run RUN (snakemake writes it with the first job that reads it: a test that
    runs alone, as tests/mutants.py runs them, asks for it here rather than rely on an earlier test)."""
    path = pipeline / "settings" / f"dist_{run}.yaml"
    if not path.exists():
        snakemake(pipeline.parent, f"results/settings/{path.name}")
    return path


def weights(dist: Path, run: str) -> dict:
    return torch.load(dist / f"{run}.pth", weights_only=True)


def torchrun(*args, env=None, timeout=180):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           str(SCRIPTS / "run.py"), *map(str, args)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                          env={**clean_env(), "OMP_NUM_THREADS": "1", **(env or {})})


# --- bit-exact pairs ------------------------------------------------------------------------------


# make test keeps DDP's resume; FSDP2's and the resharded ones run in the slow tier
@pytest.mark.parametrize("variant", [v if v == "ddp/resumed" else pytest.param(v, marks=pytest.mark.slow)
                                     for v in PAIRS_EXACT])
def test_promised_pairs_are_bit_identical(build, variant):
    """Catches: a rank-0-only data position, a missing barrier, DCP shards loaded into the wrong rank,
    accumulation that scales or sums the slices differently on 1 and 2 ranks."""
    dist = build(f"{variant}.pth", f"{PAIRS_EXACT[variant]}.pth")
    assert_same_state_dict(weights(dist, variant), weights(dist, PAIRS_EXACT[variant]))


@pytest.mark.slow
def test_the_ablations_really_differ(dist, pipeline):
    """Catches: rank0_gen, minimind_rescale or a change of batch slices silently doing the same as the plain
    resume (then the report's claims about them would be about nothing), and a rescale by the wrong rule."""
    for variant, ref in (("rank0_gen/resumed", "rank0_gen/straight"), ("minimind_rescale", "ddp/straight"),
                         ("reshard_2to1_one_slice", "ddp/straight")):
        assert not same_state_dict(weights(dist, variant), weights(dist, ref)), variant
    # MiniMind's rule: saved on 1 rank at stop_at, continued on 2 -> stop_at * 1 // 2, then the next step
    first = min(int(r["step"]) for r in csv.DictReader(open(dist / "minimind_rescale_log.csv")))
    assert first == TINY["stop_at"] * 1 // 2 + 1


def test_divergence_csv_is_recomputed_from_the_files(dist):
    """Catches: a dist/divergence.csv (and so the report's table) that does not say what the files hold."""
    rows = list(csv.DictReader(open(dist / "divergence.csv")))
    assert len(rows) == 9
    for row in rows:
        a, b = weights(dist, row["reference"]), weights(dist, row["variant"])
        names = [k for k in a if k != "lm_head.weight"]  # tied to the embedding: counted once
        diff = max((a[k].double() - b[k].double()).abs().max().item() for k in names)
        rel = math.sqrt(sum(((a[k].double() - b[k].double()) ** 2).sum().item() for k in names)
                        / sum((a[k].double() ** 2).sum().item() for k in names))
        assert float(row["max_abs_dweight"]) == pytest.approx(diff, rel=1e-6, abs=0), row["variant"]  # fp32 vs fp64
        assert float(row["rel_l2_dweight"]) == pytest.approx(rel, rel=1e-6, abs=0), row["variant"]
        assert int(row["tensors_differing"]) == len(differences({k: a[k] for k in names}, {k: b[k] for k in names}))
        log = {int(r["step"]): float(r["train_loss"]) for r in csv.DictReader(open(dist / f"{row['variant']}_log.csv"))}
        ref = {int(r["step"]): float(r["train_loss"]) for r in csv.DictReader(open(dist / f"{row['reference']}_log.csv"))}
        assert float(row["max_abs_loss_gap"]) == pytest.approx(max(abs(log[s] - ref[s]) for s in log), abs=1e-12)
        assert int(row["first_step"]) == min(log)


def test_world_size_1_through_every_switch_that_is_off_equals_the_plain_run(pipeline, tmp_path):
    """Catches: new code on the single-process path (a process group, a wrapper, a scaled loss, a
    periodic checkpoint) that changes the default run's bits."""
    cfg = yaml.safe_load((pipeline / "settings" / "straight.yaml").read_text())
    cfg["parallel"] = {"world_size": 1, "strategy": "fsdp2", "backend": "gloo", "batch_slices": 1}
    cfg["checkpoint"] = {**cfg["checkpoint"], "async": True, "every": 1}
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
    proc = run_script("run.py", "--config", tmp_path / "c.yaml", "--tokens", pipeline / "data" / "train.npy",
                      "--out", tmp_path / "s.pth", "--checkpoint-dir", tmp_path / "checkpoints")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert_same_state_dict(torch.load(tmp_path / "s.pth", weights_only=True),
                           torch.load(pipeline / "straight.pth", weights_only=True))


# --- refusals -------------------------------------------------------------------------------------


def resume_on_one_rank(pipeline, resume, out, *extra):
    """Continue RESUME in one plain process with the dist one_rank layout (the 2 -> 1 path)."""
    return run_script("run.py", "--config", dist_settings(pipeline, "one_rank"),
                      "--tokens", pipeline / "data" / "train.npy", "--resume", resume, "--out", out, *extra)


def assert_refused(proc, out: Path, *words):
    lines = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-2000:]
    for w in words:
        assert w in lines[0], lines[0]
    assert not out.exists()


def test_another_world_size_needs_reshard(build, pipeline, tmp_path):
    """Catches: a resume made on 2 ranks continued on 1 without a word (the fingerprint's world size unchecked)."""
    dist = build("ddp/resume.pth")
    out = tmp_path / "o.pth"
    assert_refused(resume_on_one_rank(pipeline, dist / "ddp" / "resume.pth", out), out, "world_size 2", "--reshard")


def other_run_metadata(tmp_path) -> bytes:
    """The .metadata of a DCP checkpoint of another state (what a copied-in file from another run holds)."""
    import torch.distributed.checkpoint as dcp

    dcp.save({"model": {"w": torch.zeros(3)}}, checkpoint_id=str(tmp_path / "other"), no_dist=True)
    return (tmp_path / "other" / ".metadata").read_bytes()


@pytest.mark.parametrize("damage, words", [
    ("missing shard", ("__1_0.distcp", "missing")),
    ("truncated shard", ("__0_0.distcp", "sha256")),
    ("metadata from another run", (".metadata", "sha256")),
], ids=["missing-shard", "truncated-shard", "other-runs-metadata"])
def test_a_damaged_resume_directory_is_refused_whole(build, pipeline, tmp_path, damage, words):
    """Catches: shards loaded without checking that every file is there and unchanged."""
    dist = build("fsdp2/resume.dcp")
    d = shutil.copytree(dist / "fsdp2" / "resume.dcp", tmp_path / "resume.dcp")
    if damage == "missing shard":
        (d / "__1_0.distcp").unlink()
    elif damage == "truncated shard":
        data = (d / "__0_0.distcp").read_bytes()
        (d / "__0_0.distcp").write_bytes(data[: len(data) // 2])
    else:
        (d / ".metadata").write_bytes(other_run_metadata(tmp_path))
    out = tmp_path / "o.pth"
    assert_refused(resume_on_one_rank(pipeline, d, out, "--reshard"), out, *words)


def edited_dir(src: Path, dest: Path, shards=None, meta=None) -> Path:
    """A copy of resume directory SRC with its shards (the whole state, as one process reads it) and its
    resume.pth edited by SHARDS and META, then resealed: the manifest and the digests recomputed, so that
    only the check of the edited entry can refuse it, never the sha256 comparison behind it."""
    import torch.distributed.checkpoint as dcp
    from mmkit.atomic import sha256_file
    from mmkit.checkpoint.entries import seal
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    if shards:
        dcp_to_torch_save(str(src), str(dest.with_suffix(".whole.pth")))
        whole = torch.load(dest.with_suffix(".whole.pth"), weights_only=True)
        shards(whole)
        dcp.save(whole, checkpoint_id=str(dest), no_dist=True)
    else:
        shutil.copytree(src, dest, ignore=shutil.ignore_patterns("resume.pth"))
    state = torch.load(src / "resume.pth", weights_only=True)
    state["manifest"] = {f.name: sha256_file(f) for f in sorted(dest.iterdir())}
    if meta:
        meta(state)
    torch.save(seal({k: v for k, v in state.items() if k != "digests"}), dest / "resume.pth")
    return dest


def first_moment(whole) -> torch.Tensor:
    return next(iter(whole["optimizer"]["state"].values()))["exp_avg"]


# the file path's bad contents (tests/test_resume_contents.py), through a DCP directory
@pytest.mark.parametrize("shards, meta, words", [
    (lambda w: w["model"]["model.norm.weight"].__setitem__(0, math.nan), None, ["'model'", "non-finite"]),
    (lambda w: w["model"].__setitem__("model.norm.weight", w["model"]["model.norm.weight"].double()), None,
     ["'model'", "float64", "float32"]),
    (lambda w: first_moment(w).__setitem__(0, math.inf), None, ["'optimizer'", "exp_avg", "non-finite"]),
    (lambda w: w["optimizer"]["param_groups"][0].__setitem__("betas", (0.8, 0.99)), None, ["'optimizer'", "betas"]),
    (None, lambda m: m.__setitem__("adamw_offset", 1), ["'optimizer'", "4 updates"]),
    (None, lambda m: m.__setitem__("step", True), ["'step'", "bool"]),
    (None, lambda m: m.__setitem__("gen_state", m["gen_state"][:100]), ["'gen_state'", "shape [100]"]),
    (None, lambda m: m["manifest"].__setitem__("../outside", "0" * 64), ["'manifest'"]),
    (None, lambda m: m["manifest"].__setitem__(".metadata", 5), ["'manifest'"]),
    (None, lambda m: m.__setitem__("manifest", {}), ["'manifest'"]),
], ids=["nan-weight", "float64-weight", "inf-exp-avg", "other-betas", "adamw-offset-1", "step-bool",
        "gen-truncated", "manifest-path-outside", "manifest-not-sha256", "manifest-empty"])
def test_a_resume_directory_with_bad_contents_is_refused_naming_the_entry(build, pipeline, tmp_path, shards, meta,
                                                                           words):
    """Catches: a DCP directory's model and optimizer shards loaded unchecked (non-finite values, a dtype DCP
    casts silently, AdamW's hyperparameters adopted from the file); resume.pth's entries not type-checked; a
    malformed manifest that ends in a traceback instead of one line."""
    dist = build("fsdp2/resume.dcp")
    d = edited_dir(dist / "fsdp2" / "resume.dcp", tmp_path / "resume.dcp", shards, meta)
    out = tmp_path / "o.pth"
    proc = resume_on_one_rank(pipeline, d, out, "--reshard")
    assert "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert_refused(proc, out, *words)
    assert "sha256" not in proc.stderr.splitlines()[-1]  # resealed: the entry's own check spoke


def test_an_unchanged_copy_of_a_resume_directory_is_accepted(build, pipeline, tmp_path):
    """The control for the test above: the copy and reseal alone change nothing (a check that refused every
    directory would pass it)."""
    dist = build("fsdp2/resume.dcp", "fsdp2_to1.pth")
    d = edited_dir(dist / "fsdp2" / "resume.dcp", tmp_path / "resume.dcp", shards=lambda w: None)
    proc = resume_on_one_rank(pipeline, d, tmp_path / "o.pth", "--reshard")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert_same_state_dict(torch.load(tmp_path / "o.pth", weights_only=True), weights(dist, "fsdp2_to1"))


def preempted_fsdp2_job(pipeline, tmp_path, **checkpoint) -> tuple[tuple, Path]:
    """A 2-rank FSDP2 job checkpointing every 3 steps, preempted after step 8 (a checkpoint then): its
    arguments, to run it again, and its checkpoint folder."""
    cfg = yaml.safe_load(dist_settings(pipeline, "fsdp2").read_text())
    cfg["checkpoint"] = {**cfg["checkpoint"], "every": 3, **checkpoint}
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
    checkpoints = tmp_path / "checkpoints"
    args = ("--config", tmp_path / "c.yaml", "--tokens", pipeline / "data" / "train.npy", "--out", tmp_path / "o.pth",
            "--loss-log", tmp_path / "o.csv", "--checkpoint-dir", checkpoints)
    proc = torchrun(*args, env={"MMKIT_FAILPOINT": "step8:0:TERM"})
    assert proc.returncode != 0 and (checkpoints / "step_000008.dcp").is_dir(), proc.stderr[-2000:]
    return args, checkpoints


def test_an_fsdp2_job_skips_its_malformed_newest_checkpoint_and_continues_from_the_one_before(build, pipeline,
                                                                                             tmp_path):
    """Catches: a malformed manifest or a refused shard that aborts auto-resume with a traceback instead of a
    warning and the next older checkpoint."""
    dist = build("fsdp2/straight.pth")
    args, checkpoints = preempted_fsdp2_job(pipeline, tmp_path, keep=2)
    newest = checkpoints / "step_000008.dcp"
    shutil.move(newest, tmp_path / "good.dcp")
    edited_dir(tmp_path / "good.dcp", newest, meta=lambda m: m["manifest"].__setitem__(".metadata", 5))
    proc = torchrun(*args)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    warnings = [line for line in proc.stderr.splitlines() if line.startswith("warning: skipping checkpoint")]
    assert len(warnings) == 1 and str(newest) in warnings[0] and "'manifest'" in warnings[0], warnings
    assert "continuing from checkpoint" in proc.stderr and "(step 6)" in proc.stderr, proc.stderr[-2000:]
    assert_same_state_dict(torch.load(tmp_path / "o.pth", weights_only=True), weights(dist, "fsdp2/straight"))


def contents(folder: Path) -> dict:
    return {p.name: p.read_bytes() for p in folder.iterdir()}


@pytest.mark.slow
def test_a_swap_killed_between_its_renames_is_finished_or_undone_never_deleted(build, pipeline, tmp_path):
    """Catches: what a kill between a directory swap's two renames leaves (NAME.old committed, NAME.tmp
    complete or not, NAME gone) deleted unread as leftovers, so the job falls back to an older checkpoint;
    a half-written .tmp committed."""
    dist = build("fsdp2/straight.pth")
    args, checkpoints = preempted_fsdp2_job(pipeline, tmp_path, keep=100, keep_when_done=True)
    step8 = contents(checkpoints / "step_000008.dcp")
    for name, complete in (("step_000006.dcp", True), ("step_000008.dcp", False)):
        d = checkpoints / name
        shutil.copytree(d, d.with_name(name + ".tmp"))  # the re-save of the same state, written whole ...
        if not complete:
            (d.with_name(name + ".tmp") / "resume.pth").unlink()  # ... or killed before it was sealed
        d.rename(d.with_name(name + ".old"))  # the first rename done, the second not
    proc = torchrun(*args)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "step_000006.dcp: a save killed before its rename was complete, and is committed now" in proc.stderr
    assert "step_000008.dcp: a save killed before its rename was not complete; the committed copy is back" \
        in proc.stderr
    assert "continuing from checkpoint" in proc.stderr and "(step 8)" in proc.stderr, proc.stderr[-2000:]
    assert contents(checkpoints / "step_000008.dcp") == step8
    assert not list(checkpoints.glob("*.old")) + list(checkpoints.glob("*.tmp"))
    assert_same_state_dict(torch.load(tmp_path / "o.pth", weights_only=True), weights(dist, "fsdp2/straight"))


class _Marker:
    """Unpickling this writes a file: what a crafted .metadata could do instead."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (Path.touch, (Path(self.path),))


def test_a_metadata_pickle_that_runs_code_is_refused(build, pipeline, tmp_path):
    """Catches: DCP's own pickle.load of .metadata (it runs the file's code), even when the attacker also
    rewrote the manifest so that every sha256 matches."""
    from mmkit.checkpoint.files import digest

    dist = build("fsdp2/resume.dcp")
    marker = tmp_path / "marker"
    evil = pickle.dumps(_Marker(marker))
    d = shutil.copytree(dist / "fsdp2" / "resume.dcp", tmp_path / "resume.dcp")
    (d / ".metadata").write_bytes(evil)
    meta = torch.load(d / "resume.pth", weights_only=True)
    meta["manifest"][".metadata"] = __import__("hashlib").sha256(evil).hexdigest()
    meta["digests"]["manifest"] = digest(meta["manifest"])
    torch.save(meta, d / "resume.pth")

    out = tmp_path / "o.pth"
    assert_refused(resume_on_one_rank(pipeline, d, out, "--reshard"), out, ".metadata", "refusing")
    assert not marker.exists()
    # the threat is real: torch's own reader runs it
    from torch.distributed.checkpoint import FileSystemReader

    with pytest.raises(AttributeError):  # after running the payload it finds no Metadata object
        FileSystemReader(str(d)).read_metadata()
    assert marker.exists()


@pytest.mark.quick
def test_the_dcp_reader_refuses_a_metadata_pickle_that_runs_code(tmp_path):
    """Catches: the reader DCP loads through (_SafeReader.read_metadata) unpickling .metadata with pickle.load.
    The test above never gets that far (read_resume_dir refuses the file first), so this one calls it directly."""
    from mmkit.errors import UserError
    from mmkit.checkpoint.dcp import _SafeReader

    marker = tmp_path / "marker"
    d = tmp_path / "resume.dcp"
    d.mkdir()
    (d / ".metadata").write_bytes(pickle.dumps(_Marker(marker)))
    try:
        _SafeReader(str(d)).read_metadata()
        refusal = None
    except Exception as e:  # noqa: BLE001 -- which exception it was is the next assertion's subject
        refusal = e
    assert not marker.exists(), "the .metadata's payload ran"
    assert isinstance(refusal, UserError) and "refusing" in str(refusal), repr(refusal)


@pytest.mark.quick
def test_the_dcp_load_planner_refuses_a_value_pickle_that_runs_code(tmp_path):
    """Catches: the non-tensor values of a DCP checkpoint (AdamW's lr, betas, ...) loaded by
    _SafeLoadPlanner.load_bytes without weights_only; and a planner that refuses plain values too."""
    import io

    from mmkit.checkpoint.dcp import _SafeLoadPlanner

    planner = _SafeLoadPlanner()
    state = {"optimizer": {"lr": 0.0}}
    planner.set_up_planner(state, None, False)
    item = SimpleNamespace(dest_index=SimpleNamespace(fqn="optimizer.lr"))

    def saved(value) -> io.BytesIO:
        buf = io.BytesIO()
        torch.save(value, buf)
        buf.seek(0)
        return buf

    planner.load_bytes(item, saved(3e-3))
    assert state["optimizer"]["lr"] == 3e-3  # a plain value still loads

    marker = tmp_path / "marker"
    try:
        planner.load_bytes(item, saved(_Marker(marker)))
        refusal = None
    except Exception as e:  # noqa: BLE001
        refusal = e
    assert not marker.exists(), "the value's payload ran"
    assert isinstance(refusal, pickle.UnpicklingError) and "Weights only load failed" in str(refusal), repr(refusal)
    assert state["optimizer"]["lr"] == 3e-3


# --- kills ----------------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_rank_killed_in_the_middle_of_a_ddp_save_fails_the_job_and_a_rerun_gives_the_same_bits(build, pipeline):
    """Catches: a resume file half-written under its final name, a torchrun exit of 0 after a dead rank,
    and a rerun that does not reproduce the run."""
    build("ddp/resume.pth")
    work, target = pipeline.parent, "results/dist/ddp/resume.pth"
    before = torch.load(work / target, weights_only=True)
    proc = subprocess.run([sys.executable, "-m", "snakemake", "--cores", "2", target, "--forcerun", "dist_ddp_resume",
                           "--configfile", "config.yaml", "tiny.yaml"], cwd=work, capture_output=True, text=True,
                          env={**clean_env(work / "src"), "MMKIT_FAILPOINT": "save:0"})
    assert proc.returncode != 0 and "dist_ddp_resume" in proc.stdout + proc.stderr
    assert not (work / target).exists()  # a failed job's output is not taken as finished
    snakemake(work, target)
    assert_same_state_dict(torch.load(work / target, weights_only=True), before)


def test_a_rank_killed_in_the_middle_of_a_dcp_save_leaves_the_previous_directory(build, pipeline, tmp_path):
    """Catches: a resume directory renamed into place before every rank's shards are on disk, or the
    previous directory removed before the new one is complete."""
    dist = build("fsdp2/resume.dcp")
    previous = shutil.copytree(dist / "fsdp2" / "resume.dcp", tmp_path / "resume.dcp")
    listing = {f.name: f.read_bytes() for f in previous.iterdir()}
    args = ("--config", dist_settings(pipeline, "fsdp2_stop"), "--tokens", pipeline / "data" / "train.npy",
            "--stop-at", "--out", previous)
    proc = torchrun(*args, env={"MMKIT_FAILPOINT": "save:1"})
    assert proc.returncode != 0
    assert {f.name: f.read_bytes() for f in previous.iterdir()} == listing
    out = tmp_path / "o.pth"
    proc = resume_on_one_rank(pipeline, previous, out, "--reshard")  # still loadable, checked whole
    assert proc.returncode == 0, proc.stderr[-2000:]
    proc = torchrun(*args)  # the rerun commits over it, with the same shards
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert not (tmp_path / "resume.dcp.tmp").exists()
    # the same shards (.metadata holds a fresh save id, resume.pth its sha256)
    assert {f.name: f.read_bytes() for f in previous.glob("*.distcp")} == \
        {k: v for k, v in listing.items() if k.endswith(".distcp")}


def test_a_rank_that_dies_mid_training_does_not_hang_the_others(pipeline, tmp_path):
    """Catches: a job that waits forever in a collective for a rank that is gone (no timeout, no teardown)."""
    t0 = time.monotonic()
    proc = torchrun("--config", dist_settings(pipeline, "ddp"), "--tokens", pipeline / "data" / "train.npy",
                    "--out", tmp_path / "o.pth", env={"MMKIT_FAILPOINT": "step2:1"}, timeout=150)
    assert proc.returncode != 0
    assert not (tmp_path / "o.pth").exists()
    assert f"exitcode: {-signal.SIGKILL}" in proc.stderr, proc.stderr[-2000:]
    print(f"torchrun ended {time.monotonic() - t0:.1f} s after launch, rank 1 killed at step 2")


@pytest.mark.slow
def test_a_minimind_rescale_job_killed_after_its_own_checkpoints_continues_from_them(build, pipeline, tmp_path):
    """Catches: a check of AdamW's counter against the step alone, which a rescaled run's checkpoints (counter
    ahead of the step) never pass: every restart silently starts over from the --resume file."""
    dist = build("minimind_rescale.pth", "one_rank/resume.pth")
    cfg = yaml.safe_load(dist_settings(pipeline, "ddp").read_text())
    cfg["checkpoint"] = {**cfg["checkpoint"], "every": 1, "keep": 2}
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
    checkpoints = tmp_path / "checkpoints"
    args = ("--config", tmp_path / "c.yaml", "--tokens", pipeline / "data" / "train.npy", "--resume",
            dist / "one_rank" / "resume.pth", "--reshard", "--minimind-rescale", "--out", tmp_path / "o.pth",
            "--loss-log", tmp_path / "o.csv", "--checkpoint-dir", checkpoints)
    killed_at = TINY["steps"] - 3
    proc = torchrun(*args, env={"MMKIT_FAILPOINT": f"step{killed_at}:0"})  # before that step's checkpoint
    assert proc.returncode != 0 and not (tmp_path / "o.pth").exists(), proc.stderr[-2000:]
    assert sorted(p.name for p in checkpoints.glob("step_*.pth"))[-1] == f"step_{killed_at - 1:06d}.pth"
    proc = torchrun(*args)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "warning: skipping checkpoint" not in proc.stderr, proc.stderr[-2000:]
    assert f"continuing from checkpoint {checkpoints / f'step_{killed_at - 1:06d}.pth'}" in proc.stderr
    assert_same_state_dict(torch.load(tmp_path / "o.pth", weights_only=True), weights(dist, "minimind_rescale"))
    assert (tmp_path / "o.csv").read_bytes() == (dist / "minimind_rescale_log.csv").read_bytes()


def test_the_reports_section_on_ranks_reads_its_numbers_from_dist(dist, pipeline, tmp_path):
    """Catches: a report table on several ranks whose numbers are typed, stale or from the wrong row."""
    p = pipeline
    proc = run_script("report.py", "--resume", p / "resume.pth", "--divergence", p / "divergence.csv",
                      "--fp16", p / "fp16.json", "--bf16", p / "bf16.json", "--optim", p / "optim.json",
                      "--entries", p / "resume_entries.md", "--straight-log", p / "straight_log.csv", "--resumed-log", p / "resumed_log.csv",
                      "--plots", p / "plots" / "loss.png", p / "plots" / "loss_gap.png",
                      "--timing", *sorted((p / "timing").glob("*.json")), "--dist", dist / "divergence.csv",
                      "--out", tmp_path / "report.md", "--summary", tmp_path / "summary.md")
    assert proc.returncode == 0, proc.stderr[-2000:]
    text = (tmp_path / "report.md").read_text()
    section = text[text.index("## 여러 프로세스"):]
    cells = {line.split(" | ")[0].lstrip("| "): line.strip(" |").split(" | ")
             for line in section.splitlines() if line.startswith("| ") and "---" not in line}
    rows = list(csv.DictReader(open(dist / "divergence.csv")))
    for row in rows:
        variant, ref, first, max_abs, rel, differing, _ = cells[row["variant"]]
        assert (ref, int(first), int(differing)) == (row["reference"], int(row["first_step"]),
                                                     int(row["tensors_differing"]))
        assert float(max_abs) == pytest.approx(float(row["max_abs_dweight"]), rel=5e-3, abs=0)  # 3 digits shown
        assert float(rel) == pytest.approx(float(row["rel_l2_dweight"]), rel=5e-3, abs=0)


def test_a_resume_file_cannot_feed_an_fsdp2_run(build, pipeline, tmp_path):
    """Catches: whole tensors from a DDP file loaded into sharded parameters with no check (the one
    layout change this code cannot reshard): one error line, nothing written."""
    dist = build("ddp/resume.pth")
    out = tmp_path / "o.pth"
    proc = torchrun("--config", dist_settings(pipeline, "fsdp2"), "--tokens", pipeline / "data" / "train.npy",
                    "--resume", dist / "ddp" / "resume.pth", "--reshard", "--out", out)
    assert proc.returncode != 0
    errors = {line for line in proc.stderr.splitlines() if line.startswith("error:")}
    assert len(errors) == 1 and "resume directory (.dcp)" in errors.pop(), proc.stderr[-2000:]
    assert not out.exists()


def test_every_dist_job_reads_exactly_the_keys_its_rule_declares(dist, pipeline):
    """Catches: a dist/ job depending on a setting its rule does not declare (a change to it would not
    rerun the job) or declaring one it never reads (a change would rerun it for nothing)."""
    import re

    from test_invalidation import declared_leaves

    logs = sorted(dist.rglob("logs/*.log"))
    assert len(logs) == 16  # 15 training jobs and the divergence
    for log in logs:
        found = re.search(r"^config keys read from (\S+): ?(.*)$", log.read_text(), re.M)
        assert found, f"{log} does not name the keys its job read"
        declared = declared_leaves(yaml.safe_load((pipeline.parent / found[1]).read_text()))
        assert set(found[2].split()) == declared, log


@pytest.mark.slow
def test_snakemakes_retry_continues_a_ddp_job_whose_rank_was_preempted(build, pipeline, tmp_path):
    """Catches: a multi-rank job whose preempted ranks end it with another status than 75, or whose retry
    starts over or ends in other bits."""
    target = "results/dist/ddp/straight.pth"
    build("ddp/straight.pth")  # once per session, shared with the bit-exact pairs; redone below in a copy
    reference = torch.load(pipeline.parent / target, weights_only=True)
    work = tmp_path / "w"
    shutil.copytree(pipeline.parent, work, symlinks=True)
    env = {**clean_env(work / "src"), "MMKIT_FAILPOINT": "step3:0:USR1"}  # rank 0 alone: torchrun hears nothing of it
    cmd = [sys.executable, "-m", "snakemake", "--cores", "2", "--retries", "1", "--forcerun", "dist_ddp_straight",
           target, "--configfile", "config.yaml", "tiny.yaml"]
    proc = subprocess.run(cmd, cwd=work, capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    log = (work / "results" / "dist" / "ddp" / "logs" / "straight.log").read_text()
    assert "continuing from checkpoint" in log and "(step 3)" in log, log[-2000:]
    assert "returned non-zero exit status 75" in proc.stderr, proc.stderr[-3000:]  # the first try: preempted
    assert_same_state_dict(torch.load(work / target, weights_only=True), reference)

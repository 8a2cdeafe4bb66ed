"""A resume file holds when the process writing it fails: out of disk, a stale .tmp, or killed under snakemake
(a kill at each moment of a save: test_crash_states, every crash state of every save path)."""

import os
import resource
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch
from conftest import (SCRIPTS, assert_same_state_dict, clean_env, copy_workflow, run_script, same_state_dict,
                      snakemake)

from mmkit.checkpoint.files import save_atomic
from mmkit.errors import UserError

def state_for(seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {"model": {f"w{i}": torch.randn(1024, 1024, generator=g) for i in range(10)}, "step": seed}


def holds(path, seed) -> bool:
    got, want = torch.load(path, weights_only=True), state_for(seed)
    return same_state_dict(got, want)


def test_a_stale_tmp_is_never_loaded(tiny_run, tmp_path):
    resume = tmp_path / "resume.pth"
    resume.write_bytes(tiny_run["resume"].read_bytes())
    (tmp_path / "resume.pth.tmp").write_bytes(b"half a checkpoint")
    proc = run_script("run.py", "--config", tiny_run["config"], "--tokens", tiny_run["tokens"],
                      "--resume", resume, "--out", tmp_path / "out.pth")
    assert proc.returncode == 0, proc.stderr
    assert torch.load(tmp_path / "out.pth", weights_only=True).keys()


@pytest.mark.quick
def test_disk_full_during_save_is_one_clear_error_and_the_previous_file_survives(tmp_path, monkeypatch):
    path = tmp_path / "resume.pth"
    save_atomic(state_for(0), path)

    class FullDisk:
        """A file whose writes fail past 1 MB, as a full disk's do."""

        def __init__(self, f):
            self.f, self.n = f, 0

        def write(self, data):
            self.n += len(data)
            if self.n > 1 << 20:
                raise OSError(28, "No space left on device")
            return self.f.write(data)

        def flush(self):
            self.f.flush()

        def fileno(self):
            return self.f.fileno()

    import mmkit.atomic

    monkeypatch.setattr(mmkit.atomic, "_DurableWriter", lambda f, W=mmkit.atomic._DurableWriter: W(FullDisk(f)))
    with pytest.raises(UserError, match="No space left on device; the previous file is untouched"):
        save_atomic(state_for(1), path)
    assert holds(path, 0) and not path.with_name("resume.pth.tmp").exists()


def test_file_too_large_in_a_real_process_exits_with_one_line(tiny_run, tmp_path):
    """A real failing write: the child may write at most 64 KB per file (RLIMIT_FSIZE)."""
    out = tmp_path / "resume.pth"
    out.write_bytes(b"the previous resume file")

    def limit():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # get EFBIG from write() instead of dying
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 16, 1 << 16))

    proc = subprocess.run(
        [sys.executable, str(SCRIPTS / "run.py"), "--config", str(tiny_run["config"]),
         "--tokens", str(tiny_run["tokens"]), "--stop-at", "2", "--out", str(out)],
        capture_output=True, text=True, env=clean_env(), preexec_fn=limit,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1] == (
        f"error: could not write {out}: File too large; the previous file is untouched")
    assert out.read_bytes() == b"the previous resume file"
    assert not out.with_name("resume.pth.tmp").exists()


@pytest.mark.slow
def test_killed_snakemake_job_is_rebuilt_alone_with_the_same_bits(pristine_pipeline, tmp_path):
    """Catches: a killed job's output taken as finished, a rerun that redoes finished jobs upstream, a rebuilt
    job with other bits than the pristine build's."""
    work = tmp_path / "wf"
    shutil.copytree(pristine_pipeline, work, symlinks=True)  # its tokens and settings, already built
    copy_workflow(work)
    (work / "results" / "straight.pth").unlink()  # the job to run again
    # each step made 0.3 s longer (mmkit.failpoint; no bit changes), so that the tiny job is caught running
    cmd = [sys.executable, "-m", "snakemake", "--cores", "1", "results/straight.pth",
           "--configfile", "config.yaml", "tiny.yaml"]
    job = subprocess.Popen(cmd, cwd=work, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           env={**clean_env(work / "src"), "MMKIT_FAILPOINT": "slow=0.3"}, start_new_session=True)
    log = work / "results" / "logs" / "straight.log"
    deadline = time.monotonic() + 120
    while not (log.exists() and "step    4/" in log.read_text()):
        assert time.monotonic() < deadline and job.poll() is None, "the training job never got going"
        time.sleep(0.05)
    os.killpg(job.pid, signal.SIGKILL)  # snakemake and its job, as a lost machine would
    job.wait()
    results = work / "results"
    assert not (results / "straight.pth").exists() and not list(results.rglob("*.tmp"))

    snakemake(work, "--unlock")  # the killed snakemake could not release its lock
    plan = snakemake(work, "-n", "--rerun-incomplete", "results/straight.pth").stdout
    assert "straight" in plan and "tokenize" not in plan.split("Job stats:")[1]
    snakemake(work, "--rerun-incomplete", "results/straight.pth")
    # the same bits as the uninterrupted build of the same job
    assert_same_state_dict(torch.load(results / "straight.pth", weights_only=True),
                           torch.load(pristine_pipeline / "results" / "straight.pth", weights_only=True))


@pytest.mark.quick
def test_a_save_writes_flushes_fsyncs_the_file_renames_then_fsyncs_the_directory(tmp_path, monkeypatch):
    """A SIGKILL keeps the page cache, so only the order of the calls can show that a save survives power
    loss: the bytes reach the file and the disk before the rename, and the rename reaches the disk after."""
    import stat

    import mmkit.atomic as atomic

    events, real_fsync, real_replace = [], os.fsync, os.replace
    path = tmp_path / "resume.pth"
    payload = b"x" * 100  # small: without the flush it would still sit in Python's buffer at fsync time

    def fsync(fd):
        st = os.fstat(fd)
        events.append(("fsync dir" if stat.S_ISDIR(st.st_mode) else f"fsync file of {st.st_size} bytes"))
        real_fsync(fd)

    def replace(src, dst):
        events.append(f"rename {os.path.basename(src)} -> {os.path.basename(dst)}")
        real_replace(src, dst)

    monkeypatch.setattr(atomic.os, "fsync", fsync)
    monkeypatch.setattr(atomic.os, "replace", replace)
    atomic.write_atomic(path, lambda f: f.write(payload))
    assert events == ["fsync file of 100 bytes", "rename resume.pth.tmp -> resume.pth", "fsync dir"]
    assert path.read_bytes() == payload

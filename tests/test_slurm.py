"""On a real SLURM cluster: the whole DAG through profiles/slurm, preempted and requeued, bit-identical to the
tests' local build of the tiny pipeline.

The cluster is real (munged, slurmctld, slurmd), started by cluster/start.sh, which needs root on Debian;
elsewhere these tests skip with the reason, and in CI a skip is a failure.
"""

import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml
from conftest import CHECKPOINTED, NOT_COMPARED, REPO, STOP_AT_SESSION_END, clean_env, compare_builds, copy_workflow

# the tiny pipeline with a checkpoint every 2 steps, each step made 0.5 s longer (mmkit.failpoint): a 12-step
# training job runs for some seconds, long enough to be caught running after its first checkpoint. The sleep
# changes no bit, so the build must equal the pristine one (settings/ apart: checkpoint.every)
SLURM_RUN = CHECKPOINTED
SLOW = {"MMKIT_FAILPOINT": "slow=0.5"}
DAG_TIMEOUT_S = 900


@pytest.mark.quick
def test_the_slurm_profile_plans_every_job_with_its_partition_signal_and_resources():
    """make test's witness of the slow SLURM tier (no cluster): a dry run through profiles/slurm plans the whole
    DAG, every job with the profile's partition and USR1 warning and its rule's cpus, memory and runtime.
    Catches: a profile snakemake cannot read, or one whose default resources never reach the jobs (a job
    submitted without --signal gets no time to checkpoint before its limit)."""
    dry_run = [sys.executable, "-m", "snakemake", "--profile", "profiles/slurm", "-n", "--forceall"]
    proc = subprocess.run(dry_run, capture_output=True, text=True, cwd=REPO, env=clean_env(), timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    jobs = re.findall(r"^(?:local)?rule (\w+):\n((?:    .*\n?)+)", proc.stdout + proc.stderr, re.M)
    trained = [block for rule, block in jobs if rule in ("straight", "resume", "resumed")]
    assert len(trained) == 3, [rule for rule, _ in jobs]
    for block in trained:
        resources = re.search(r"^    resources: (.*)$", block, re.M)[1]
        assert "slurm_partition=debug" in resources and "slurm_extra=--signal=USR1@60" in resources, resources
        assert re.search(r"cpus_per_task=\d", resources) and re.search(r"runtime=\d", resources), resources


@pytest.fixture(scope="session")
def cluster():
    """Up until the whole test run ends, not this module or this xdist worker: with the SLURM client installed
    and no controller, every Snakemake start waits 9 s (the SLURM executor plugin runs `scontrol show config`
    when it is imported, and scontrol retries), and the other worker's would. In CI, a machine thrown away
    afterwards, it stays up for `make mutants` too."""
    if os.geteuid() != 0:
        pytest.skip("the local SLURM cluster (cluster/start.sh) needs root")
    if not (shutil.which("slurmctld") or shutil.which("apt-get")):
        pytest.skip("no SLURM binaries and no apt-get to install them")
    proc = subprocess.run([REPO / "cluster" / "start.sh"], capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        pytest.skip(f"the SLURM cluster did not start: {proc.stderr.strip().splitlines()[-1:]}")
    yield
    if "already up" not in proc.stderr and not os.environ.get("CI"):  # stop only what this session started,
        STOP_AT_SESSION_END.touch()  # once every worker is done (conftest.pytest_sessionfinish)


def workdir(path: Path) -> Path:
    work = copy_workflow(path)
    shutil.copytree(REPO / "profiles", work / "profiles", dirs_exist_ok=True)
    (work / "slurm_run.yaml").write_text(yaml.safe_dump(SLURM_RUN))
    return work


def snakemake_cmd(*args):
    return [sys.executable, "-m", "snakemake", *args, "--configfile", "config.yaml", "slurm_run.yaml"]


def squeue(rule: str, states="all") -> list[tuple[str, str]]:
    """(job id, state) of the SLURM jobs the executor submitted for RULE (it puts rule_<name> in the comment)."""
    out = subprocess.run(["squeue", "-h", "-t", states, "-o", "%i %T %k"], capture_output=True, text=True,
                         timeout=30).stdout
    return [(i, s) for i, s, c in (line.split(maxsplit=2) for line in out.splitlines()) if c == f"rule_{rule}"]


def usr1(job: str) -> None:
    subprocess.run(["scancel", "--signal=USR1", job], check=True, timeout=30)


def requeue(job: str) -> None:
    subprocess.run(["scontrol", "requeue", job], check=True, timeout=30)
    threading.Thread(target=release, args=(job,), daemon=True).start()


def release(job: str) -> None:
    """SLURM holds a requeued job for 2 minutes (BeginTime): once it is pending again, start it now, as an
    admin may (an update while the job is still completing is ignored)."""
    for _ in range(120):
        state = subprocess.run(["squeue", "-j", job, "-h", "-o", "%T"], capture_output=True, text=True,
                               timeout=30).stdout.strip()
        if state == "PENDING":
            subprocess.run(["scontrol", "update", f"JobId={job}", "StartTime=now"], timeout=30)
            return
        time.sleep(0.5)


def preempt_when_running(work: Path, rule: str, action) -> str | None:
    """Once RULE's job has written its first checkpoint, apply ACTION to the job id."""
    if not any((work / "results" / "checkpoints" / rule).glob("step_*")):
        return None
    running = squeue(rule, "RUNNING")
    if not running:
        return None
    job = running[0][0]
    action(job)
    return job


@pytest.mark.slow
def test_the_dag_on_slurm_survives_usr1_and_a_requeue_and_equals_a_local_build(cluster, tmp_path, request):
    """Catches: a profile or rule that does not run on SLURM, a preempted job that does not checkpoint, a
    retry or requeue that starts over wrongly or loses the checkpoint, any artifact that differs from a
    local build."""
    work = workdir(tmp_path / "slurm")
    t0 = time.monotonic()
    dag = subprocess.Popen(snakemake_cmd("--workflow-profile", "profiles/slurm"), cwd=work,
                           env={**clean_env(work / "src"), **SLOW},
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    # straight: SLURM signals USR1 (as before a time limit): checkpoint, exit 75, and Snakemake's retry resumes
    # resumed: the scheduler requeues it (as a preempting partition does): SIGTERM, and the same job runs again
    plan = {"straight": usr1, "resumed": requeue}
    preempted = {}
    while dag.poll() is None and time.monotonic() - t0 < DAG_TIMEOUT_S:
        for rule, action in plan.items():
            if rule not in preempted:
                job = preempt_when_running(work, rule, action)
                if job:
                    preempted[rule] = job
        time.sleep(0.2)
    if dag.poll() is None:
        os.killpg(dag.pid, 9)
        pytest.fail(f"the SLURM DAG did not finish in {DAG_TIMEOUT_S} s")
    output = dag.stdout.read()
    seconds = time.monotonic() - t0
    assert dag.returncode == 0, output[-4000:]
    assert preempted.keys() == plan.keys(), f"caught running: {preempted}\n{output[-2000:]}"

    # the USR1'd job failed (exit 75) and a second job finished it; the requeued one ran twice under one id
    submitted = re.findall(r"with SLURM jobid (\d+) \(log: \S+/rule_straight/", output)
    states = dict(squeue("straight"))
    assert [states[j] for j in submitted] == ["FAILED", "COMPLETED"], (submitted, states)
    show = subprocess.run(["scontrol", "show", "job", preempted["resumed"]], capture_output=True, text=True).stdout
    assert "Restarts=1" in show and "JobState=COMPLETED" in show, show
    for rule in plan:
        log = (work / "results" / "logs" / f"{rule}.log").read_text()
        assert "resume: continuing from checkpoint" in log, log[-1500:]

    # the local build: the tests' pristine tiny pipeline (built meanwhile by the other worker, or waited for here)
    local = request.getfixturevalue("pristine_pipeline") / "results"
    compared, differing = compare_builds(work / "results", local, NOT_COMPARED)
    assert compared == compare_builds(local, work / "results", NOT_COMPARED)[0]  # the same files
    print(f"\nSLURM DAG: {seconds:.0f} s, {len(compared)} artifacts, {len(differing)} differ; USR1 to job "
          f"{preempted['straight']} (straight), requeue of job {preempted['resumed']} (resumed)")
    assert differing == []
    assert not (work / "results" / "checkpoints").exists() or not any((work / "results" / "checkpoints").rglob("step_*"))


@pytest.mark.slow
def test_a_partition_that_does_not_exist_is_one_clear_error_not_a_hang(cluster, tmp_path):
    """Catches: a bad site setting that leaves Snakemake waiting forever."""
    work = workdir(tmp_path / "w")
    proc = subprocess.run(snakemake_cmd("--workflow-profile", "profiles/slurm", "--set-resources",
                                        "tokenize:slurm_partition=nosuchpartition", "--", "results/data/train.npy"),
                          cwd=work, capture_output=True, text=True, env=clean_env(work / "src"), timeout=300)
    assert proc.returncode != 0
    assert "nosuchpartition" in proc.stderr + proc.stdout, (proc.stderr + proc.stdout)[-3000:]


@pytest.mark.slow
def test_the_cluster_scripts_are_idempotent_and_stop_only_what_they_started(cluster, tmp_path):
    """Catches: a second start that restarts or duplicates daemons, a stop that ends other processes."""
    state = Path(os.environ.get("MMKIT_SLURM_STATE", "/run/mmkit-slurm")) / "pids"
    before = state.read_text() if state.exists() else ""
    proc = subprocess.run([REPO / "cluster" / "start.sh"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "already up" in proc.stderr, proc.stderr
    assert (state.read_text() if state.exists() else "") == before
    for line in before.splitlines():
        name, pid = line.split()
        assert Path(f"/proc/{pid}/comm").read_text().strip() == name  # the recorded PIDs are those daemons

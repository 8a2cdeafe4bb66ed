"""A config change reruns exactly the jobs whose outputs it changes: never fewer (a stale artifact that
looks finished), never more (a wasted training run).

For each key: take the tiny pipeline (the old value: built once per test run and shared), the dry run's
plan for the new value, and build incrementally in a copy of it. In a copy of that build, snakemake -f runs
again, under the new value, exactly the jobs the plan left alone: they must write the bytes it kept (logs,
timings and the report's wall-time line aside), so that, every planned job having run under the new value,
the build is byte for byte a fresh one. And every planned job must change an output, or be allowed not to.
"""

import re
import shutil

import pytest
import yaml
from conftest import REPO, copy_workflow, snakemake

# One key per kind of change, not per group of the settings table: the keys of a group are read by the same
# jobs, which the next test checks by construction for every key, so a key's change reruns the jobs of its
# group's settings files and what follows them. stop_at changes one job's settings file (resume's) and reruns
# what follows it alone; a data key changes the DAG's root and reruns every job. A model or training key's
# change (the training jobs' settings files, then fp16, bf16, inference and divergence) is the same mechanism
# as stop_at's on a subset of the data key's jobs: it was one more near-whole build (66 s of a 2-core run).
CHANGES = {
    "stop_at": {"stop_at": 2},
    "data.val_fraction": {"data": {"val_fraction": 0.2}},
}
# Jobs a change may rerun without changing their outputs, and why: optim.json counts the resume file's
# elements and notes its step, a function of the shapes and the cut, not of the values. Snakemake reruns it
# whenever resume.pth changes, since only running it can tell.
MAY_RERUN_UNCHANGED = {key: {"optim"} for key in CHANGES}
NOT_COMPARED = ("logs/", "timing/")
WALL_TIME_LINE = "학습 시간:"  # report.md's one time-bearing line


def outputs(results) -> dict:
    """{relative path: bytes} of every artifact, with what legitimately differs between two builds left out."""
    files = {}
    for path in sorted(p for p in results.rglob("*") if p.is_file()):
        rel = path.relative_to(results).as_posix()
        if rel.startswith(NOT_COMPARED):
            continue
        data = path.read_bytes()
        if rel == "report.md":
            lines = data.decode().splitlines(keepends=True)
            data = "".join(line for line in lines if not line.startswith(WALL_TIME_LINE)).encode()
        files[rel] = data
    return files


def planned(log: str) -> dict:
    """{job: its outputs} from snakemake's job listing (a dry run's, or a run's log); a job is named by its
    rule and first output."""
    jobs = {}
    for rule, block in re.findall(r"^(?:local)?rule (\w+):\n((?:    .*\n?)+)", log, re.M):
        out = re.search(r"^    output: (.*)$", block, re.M)
        if out:
            files = [f.removeprefix("results/") for f in out.group(1).split(", ")]
            jobs[f"{rule}:{files[0]}"] = [f for f in files if not f.startswith(NOT_COMPARED)]
    return jobs


def build(work, *args):
    return snakemake(work, *args, configfiles=("config.yaml", "tiny.yaml", "change.yaml"))


@pytest.fixture(scope="module")
def old_build(pristine_pipeline):
    """The tiny pipeline, as built by config.yaml + tiny.yaml (read only: the test builds in copies). It was a
    build of its own, of a smaller overlay: the process starts, not the model's size, set its time."""
    return pristine_pipeline


@pytest.mark.slow
@pytest.mark.parametrize("key", CHANGES)
def test_a_changed_setting_reruns_exactly_the_jobs_it_changes(old_build, tmp_path, key):
    incremental = tmp_path / "incremental"
    shutil.copytree(old_build, incremental, symlinks=True)  # copy2 keeps mtimes, .snakemake keeps the record
    copy_workflow(incremental)  # the code under test (the same bytes and mtimes, but for tests/mutants.py's)
    (incremental / "change.yaml").write_text(yaml.safe_dump(CHANGES[key]))
    plan = planned(build(incremental, "-n").stdout)
    unplanned = sorted(planned(build(incremental, "-n", "--forceall").stdout).keys() - plan.keys())
    build(incremental)
    old, new = (outputs(w / "results") for w in (old_build, incremental))

    # Only a job the plan left alone can be stale: run each again under the new value, from the build's
    # inputs. -f forces the named targets only, not the jobs that follow them (snakemake 9.27.1; checked).
    if unplanned:
        redone = tmp_path / "redone"
        shutil.copytree(incremental, redone, symlinks=True)
        proc = build(redone, "-f", *(f"results/{job.partition(':')[2]}" for job in unplanned))
        assert sorted(planned(proc.stderr)) == unplanned, "snakemake -f ran other jobs than those named"
        fresh = outputs(redone / "results")
        stale = sorted(f for f in fresh.keys() | new.keys() if fresh.get(f) != new.get(f))
        assert not stale, f"{key}: stale (run again under it, a job left alone writes other bytes): {stale}"

    changed = {f for f in new if new[f] != old.get(f)}
    planned_files = {f for files in plan.values() for f in files}
    assert changed <= planned_files  # the jobs left alone kept the old bytes; said here for the message
    unchanged_jobs = {job for job, files in plan.items() if not changed & set(files)}
    allowed = {job for job in unchanged_jobs if job.split(":")[0] in MAY_RERUN_UNCHANGED.get(key, ())}
    print(f"\n{key}: planned {sorted(plan)}\n{key}: changed {sorted(changed)}\n"
          f"{key}: rerun unchanged (allowed) {sorted(allowed)}")
    assert unchanged_jobs == allowed, f"{key}: planned but unchanged: {sorted(unchanged_jobs - allowed)}"


# --- by construction: a job reads exactly what its rule declares ------------------------------------


def schema_leaves(schema: dict, prefix: str = "") -> set:
    leaves = set()
    for key, sub in schema["properties"].items():
        leaves |= schema_leaves(sub, f"{prefix}{key}.") if "properties" in sub else {prefix + key}
    return leaves


def declared_leaves(values: dict, prefix: str = "") -> set:
    leaves = set()
    for key, v in values.items():
        leaves |= declared_leaves(v, f"{prefix}{key}.") if isinstance(v, dict) else {prefix + key}
    return leaves


def test_every_job_reads_exactly_the_keys_its_rule_declares(pipeline):
    """A declared key no job reads would rerun jobs for nothing; a key read but not declared would fail
    the job (next test). Every key the schema allows is read by some job or only names a file."""
    read_by = {}
    for log in (pipeline / "logs").rglob("*.log"):
        found = re.search(r"^config keys read from (\S+): ?(.*)$", log.read_text(), re.M)
        if found:
            read_by[log.stem] = (pipeline.parent / found[1], set(found[2].split()))
    assert read_by.keys() == {"tokenize", "straight", "resume", "resumed", "noopt", "noskip", "nosched",
                              "halfresume", "fp16", "bf16", "inference", "divergence"}
    for job, (settings, read) in read_by.items():
        assert read == declared_leaves(yaml.safe_load(settings.read_text())), job
    assert read_by["straight"][1] | {"stop_at"} == read_by["resume"][1]  # the cut is all that resume adds

    read_somewhere = set().union(*(read for _, read in read_by.values()))
    # keys that name files, and those that only choose what a target builds ("dist": `all`; the audit's
    # frameworks and scenarios: `audit`, whose jobs read seed, threads and model.vocab_size; the releases it
    # runs them in: `audit_releases`; certify's entries: `certify`, whose jobs run their commands and read no
    # settings file): the Snakefile's
    names_files = {"outdir", "data.train_tokens", "data.val_tokens", "dist", "audit.frameworks", "audit.scenarios",
                   "certify", "audit_releases.scenarios", "audit_releases.envs",
                   *(f"audit_releases.releases.{f}" for f in ("transformers", "accelerate", "lightning"))}
    schema = yaml.safe_load((REPO / "workflow" / "schemas" / "config.schema.yaml").read_text())
    assert read_somewhere | names_files == schema_leaves(schema) and not read_somewhere & names_files


def test_a_job_reading_an_undeclared_key_fails_before_any_step(pipeline, tmp_path):
    from conftest import run_script

    # the fp16 job's settings hold the model and seq_len: a training run reads the seed too
    out = tmp_path / "o.pth"
    proc = run_script("run.py", "--config", pipeline / "settings" / "fp16.yaml",
                      "--tokens", pipeline / "data" / "train.npy", "--out", out)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()]  # one line
    assert proc.stderr.startswith("error: config key 'seed' is not in config file") and "READS" in proc.stderr
    assert not out.exists()

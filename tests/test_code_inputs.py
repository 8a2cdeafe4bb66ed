"""A job's code inputs are the package modules its script imports, directly or through other modules
(code_inputs in workflow/rules/code.smk derives them from the imports): editing a module reruns every job
whose script imports it, and what follows from their outputs, and nothing else.

The breakage these tests catch is a list of modules that misses one the script imports, as the hand-kept
lists did: checkpoint.py (now checkpoint/files.py) imports failpoint.py, which the rules of the scripts importing it
(fp16, bf16, inference, optim, resume_fp16, divergence, report, dist_divergence) did not declare, and
the training rules missed resume.py, store.py and fingerprint.py as soon as run.py's modules imported
them: an edit to one left those artifacts stale while they looked finished. The expected importers come
from the standard library's modulefinder, not from the function under test.
"""

import os
import re
import shutil
from functools import cache
from modulefinder import ModuleFinder
from pathlib import Path

import pytest
from conftest import REPO, snakemake

MMKIT = REPO / "src" / "mmkit"
MODULES = sorted(p.relative_to(MMKIT).as_posix() for p in MMKIT.rglob("*.py"))  # checkpoint/manager.py too


def jobs(proc) -> dict:
    """{job: (its input files, its output files, its shell command)} from a dry run's listing (the command
    with --printshellcmds); a job is named by its rule and first output."""
    found = {}
    for block in re.split(r"^\[.*\]$", proc.stdout, flags=re.M)[1:]:
        rule = re.search(r"^(?:local)?rule (\w+):", block, re.M)
        if not rule:
            continue
        files = {k: re.search(rf"^    {k}: (.*)$", block, re.M) for k in ("input", "output")}
        files = {k: m[1].split(", ") if m else [] for k, m in files.items()}
        shell = re.search(r"^Shell command: (.*)$", block, re.M)
        name = ":".join([rule[1], *files["output"][:1]])
        found[name] = (set(files["input"]), set(files["output"]), shell[1] if shell else "")
    return found


@cache
def finder(script: Path) -> ModuleFinder:
    """Python's own modulefinder run on SCRIPT (imports inside functions too), finding only what lies beside
    it and the lab's package (the copy's src/): what it imports from elsewhere (torch, ...) is left in its
    badmodules."""
    found = ModuleFinder(path=[str(script.parent), str(script.parents[2] / "src")])
    found.run_script(str(script))
    return found


def imported_modules(script: Path) -> set:
    """The package's files SCRIPT imports, by their path in the package (data.py, checkpoint/manager.py)."""
    package = script.parents[2] / "src" / "mmkit"
    return {Path(m.__file__).relative_to(package).as_posix() for name, m in finder(script).modules.items()
            if (name == "mmkit" or name.startswith("mmkit.")) and m.__file__}


def packages_from_elsewhere(script: Path) -> set:
    """The top-level names SCRIPT imports, directly or through the package, that are not beside it."""
    return {name.partition(".")[0] for name in finder(script).badmodules}


def scripts_of(shell: str, work: Path) -> list[Path]:
    """The scripts a job's command runs: one, or a launcher and the script it starts (torchrun.py run.py)."""
    return [work / w for w in shell.split() if w.endswith(".py")]


def imported_by(shell: str, work: Path) -> set:
    return set().union(*(imported_modules(s) for s in scripts_of(shell, work)))


@pytest.fixture(scope="module")
def copy(pipeline, tmp_path_factory):
    """A copy of the built tiny pipeline, up to date, with every job of `all` and what it imports."""
    work = tmp_path_factory.mktemp("code_inputs") / "copy"
    shutil.copytree(pipeline.parent, work, symlinks=True)  # copy2 keeps mtimes, .snakemake keeps the record
    if jobs(snakemake(work, "-n")):  # the shared pipeline (tests/mutants.py) may be built by other code
        snakemake(work)
    everything = jobs(snakemake(work, "-n", "-p", "--forceall"))
    imports = {}
    for job, (_, _, shell) in everything.items():
        imports[job] = imported_by(shell, work)
    return work, everything, imports


def downstream(graph: dict, start: set) -> set:
    """START and every job that reads, through any chain, an output of one of them."""
    reached, todo = set(start), list(start)
    while todo:
        outputs = graph[todo.pop()][1]
        for job, (inputs, _, _) in graph.items():
            if job not in reached and inputs & outputs:
                reached.add(job)
                todo.append(job)
    return reached


@pytest.mark.slow
@pytest.mark.parametrize("module", MODULES)
def test_editing_a_module_reruns_the_jobs_whose_scripts_import_it_and_only_what_follows(copy, module):
    work, everything, imports = copy
    path = work / "src" / "mmkit" / module
    text, stat = path.read_bytes(), path.stat()
    try:
        # a real edit: snakemake ignores a newer mtime when the file's checksum is unchanged
        path.write_bytes(text + b"\n# edited\n")
        planned = jobs(snakemake(work, "-n")).keys()
    finally:
        path.write_bytes(text)
        os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    importers = {job for job, modules in imports.items() if module in modules}
    expected = downstream(everything, importers)
    assert not importers - planned, f"{module}: jobs whose scripts import it are not rerun"
    assert planned == expected, (f"{module}: planned but neither importing it nor downstream: "
                                 f"{sorted(planned - expected)}; expected but not planned: {sorted(expected - planned)}")


def test_every_job_declares_exactly_the_modules_its_script_imports(copy):
    """Also the dist/ jobs, which the tiny pipeline does not build: a missing module leaves a job stale, an
    extra one reruns it for nothing."""
    work, _, _ = copy
    checked = 0
    for job, (inputs, _, shell) in jobs(snakemake(work, "-n", "-p", "--forceall", "all", "dist")).items():
        if not scripts_of(shell, work):
            continue
        declared = {m[1] for f in inputs if (m := re.search(r"(?:^|/)src/mmkit/(.+)$", f))}
        assert declared == imported_by(shell, work), job
        checked += 1
    assert checked > 30  # every training, dist/ and analysis job, and the settings files


def test_the_default_build_imports_none_of_the_packages_only_the_audit_installs(copy):
    """make results installs requirements.txt only; the audit's trainers come with requirements-audit.txt.
    Catches: a job of `all` whose script (or a module it imports) imports one of them, which fails on a
    fresh clone's make results; and a trainer put back into requirements.txt."""
    def names(requirements):
        lines = (line.split("#")[0].strip() for line in (REPO / requirements).read_text().splitlines())
        return {re.split(r"[=<>\[ ]", line)[0].replace("-", "_") for line in lines if line and line[0] != "-"}

    audit_only = names("requirements-audit.txt")
    assert audit_only >= {"transformers", "accelerate", "lightning", "torchdata"}
    assert not audit_only & names("requirements.txt")
    work, everything, _ = copy
    imported = {job: set().union(*map(packages_from_elsewhere, scripts_of(shell, work)))
                for job, (_, _, shell) in everything.items()}
    assert any("torch" in found for found in imported.values())  # the finder sees what lies elsewhere
    assert {job: found & audit_only for job, found in imported.items() if found & audit_only} == {}

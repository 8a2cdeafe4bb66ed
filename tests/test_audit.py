"""The audit of other trainers: each framework's plain mid-epoch cell and its 2-rank cell (ddp2), certify runs
built by `snakemake audit` on the tiny pipeline, read back from their certificates and final parameters; the
negative controls; the summary's numbers recomputed from the files; bad input.

Each test names the breakage it catches.
"""

import json
import random
import re
import shutil
import subprocess
import sys

import pytest
import torch
import yaml
from conftest import copy_workflow, script_module, snakemake

from trainer_audit import audit
from mmkit.errors import UserError

FRAMEWORKS = ["own", "transformers", "accelerate", "lightning"]
SCENARIO = "mid_epoch"
SCENARIOS = [SCENARIO, "ddp2"]  # the cut is the same in both
# and one cell beyond the matrix: a SIGKILL 2 steps after the cut's checkpoint, the steps between lost
CELLS = [(f, s) for s in SCENARIOS for f in FRAMEWORKS] + [("transformers", "lost_steps")]
CUT = audit.SCENARIOS[SCENARIO].cut
# the pieces in the causal order docs/certify.md states, what a step reads before what it writes; a step where
# only an RNG state differs computed nothing different (docs/certify.md: what exact means)
CAUSAL = ["params_in", "samples", "rng_torch", "rng_numpy", "rng_python", "rng_cuda", "gradients", "scale", "lr", "optimizer",
          "params"]


@pytest.fixture(scope="module")
def built(pristine_pipeline, tmp_path_factory):
    """The audit of every framework in the plain mid-epoch scenario (each cell with its negative control) and on
    2 ranks, added to a copy of the tiny pipeline of its own (its jobs' logs would join the pipeline's);
    returns its audit folder."""
    work = tmp_path_factory.mktemp("audit") / "copy"
    shutil.copytree(pristine_pipeline, work, symlinks=True)
    copy_workflow(work)
    (work / "audit.yaml").write_text(yaml.safe_dump({"audit": {"frameworks": FRAMEWORKS, "scenarios": SCENARIOS}}))
    snakemake(work, "audit", "results/audit/transformers/lost_steps/cell.json",
              configfiles=("config.yaml", "tiny.yaml", "audit.yaml"))
    return work / "results" / "audit"


def rows(run_folder, rank=0) -> dict:
    """{step: row} of RANK's certificate of one certify run."""
    lines = (run_folder / f"rank{rank}.jsonl").read_text().splitlines()
    return {r["step"]: r for r in map(json.loads, lines) if "step" in r}


def unseeded(straight: dict, stopped: dict) -> set:
    """The RNGs the script never seeds: they differ between two fresh processes from their first step."""
    return {p for p in straight[1] if p.startswith("rng_") and straight[1][p] != stopped[1][p]}


def differing(a: dict, b: dict, ignore: set) -> list:
    """The pieces of two rows that differ, in causal order, where anything the step computed differs."""
    pieces = [p for p in CAUSAL if p not in ignore and a.get(p) != b.get(p)]
    return pieces if any(not p.startswith("rng_") for p in pieces) else []


def same_final(a, b, rank=0) -> bool:
    x, y = (torch.load(f / f"rank{rank}.final.pt", weights_only=True) for f in (a, b))
    return len(x) == len(y) and all(s.shape == t.shape and torch.equal(s, t) for s, t in zip(x, y))


def judged_from_files(runs, scenario: str, repaired: bool) -> dict:
    """A cell's verdict recomputed here from certify's files in RUNS: {exact, first: (step, piece) or None,
    repaired: whether the repaired run matches the straight run on every rank} (REPAIRED: a repaired run
    exists). Checks on the way that every rank was recorded from the right steps, each step with its own
    forwards (Lightning runs them inside optimizer.step, in a closure), and that the stopped run repeated the
    straight one."""
    exact, firsts, repaired_ok = True, [], True
    cut = audit.SCENARIOS[scenario].cut
    for rank in range(audit.SCENARIOS[scenario].ranks):
        straight, stopped, resumed = (rows(runs / name, rank) for name in ("straight", "stopped", "resumed"))
        assert sorted(straight) == list(range(1, audit.STEPS + 1))
        assert {r["forwards"] for r in straight.values()} == {audit.SCENARIOS[scenario].accumulation}
        assert sorted(resumed) == list(range(cut + 1, audit.STEPS + 1))  # a new process, from the cut
        ignore = unseeded(straight, stopped)
        assert all(not differing(straight[s], stopped[s], ignore) for s in range(1, cut + 1)), "not deterministic"
        diffs = {s: differing(straight[s], resumed[s], ignore) for s in sorted(resumed)}
        exact &= same_final(runs / "straight", runs / "resumed", rank) and not any(diffs.values())
        firsts += [(s, CAUSAL.index(d[0]), d[0]) for s, d in diffs.items() if d][:1]
        if repaired:
            again = rows(runs / "repaired", rank)
            repaired_ok &= all(not differing(straight[s], again[s], ignore) for s in sorted(resumed))
            repaired_ok &= same_final(runs / "straight", runs / "repaired", rank)
    first = min(firsts) if firsts else None  # the earliest step, then the piece earliest in causal order
    return {"exact": exact, "first": first and (first[0], first[2]), "repaired": repaired and repaired_ok}


@pytest.mark.slow
@pytest.mark.parametrize("framework,scenario", CELLS)
def test_each_framework_resumes_through_its_own_resume_and_the_cell_says_how_exactly(built, framework, scenario):
    """Catches: a cell that calls a resume exact when a tensor differs on any rank (or the reverse), a first
    difference that is not the first (at the first differing step, the piece that comes first on any rank), a
    resume that did not start right after the cut (after lost steps too), a rank not recorded, a stopped run
    that did not repeat the straight one, a repair called exact whose run does not match the straight run."""
    cell = json.loads((built / framework / scenario / "cell.json").read_text())
    stopped = built / framework / scenario / "certify" / "stopped"
    # the rank that killed the group wrote it, flushed and synced (another rank's last line may be cut)
    killed = {json.loads(line)["killed"] for f in stopped.glob("rank*.jsonl") for line in f.read_text().splitlines()
              if line.startswith('{"rank": ') and '"killed": ' in line and line.endswith("}")}
    assert killed == {CUT + 1 + audit.SCENARIOS[scenario].lose}
    found = judged_from_files(built / framework / scenario / "certify", scenario, cell["repair_exact"] is True)
    assert cell["exact"] == found["exact"]
    if not found["exact"] and found["first"]:
        assert (cell["first_step"], cell["first_state"]) == found["first"]
    assert found["repaired"] == (cell["repair_exact"] is True)


@pytest.mark.slow
def test_this_projects_run_py_is_certified_exact_and_its_weights_agree(built):
    """Catches: a recorder that changes what run.py computes, or a verdict of exact that its weights refute;
    run.py's auto-resume continuing from anything but its own step-K checkpoint. (The own row of the audit
    is run.py under certify, unmodified, auto-resumed from its checkpoint folder.)"""
    cell = json.loads((built / "own" / SCENARIO / "cell.json").read_text())
    runs = built / "own" / SCENARIO / "certify"
    assert cell["exact"] is True and same_final(runs / "straight", runs / "resumed"), cell
    assert judged_from_files(runs, SCENARIO, repaired=False)["exact"]
    resumed_log = (runs / "resumed.log").read_text()
    assert "continuing from checkpoint" in resumed_log and f"step_{CUT:06d}.pth" in resumed_log, resumed_log[-1500:]


@pytest.mark.slow
def test_a_cell_whose_straight_run_is_another_cells_command_reuses_that_run_and_no_other_does(built):
    """Catches: the audit running the same straight run twice (lost_steps is mid_epoch's command), or reusing
    one across commands (2 ranks are another command). A straight run carries its start and end time
    (straight.json): two runs never share them, so equal records mean one run, copied."""
    def record(scenario, framework="transformers"):
        return json.loads((built / framework / scenario / "certify" / "straight.json").read_text())

    assert record("lost_steps") == record("mid_epoch")
    for scenario in ("lost_steps", "mid_epoch"):
        for f in ("rank0.jsonl", "rank0.rng.pt", "rank0.final.pt"):  # the certificate the verdict read
            assert (built / "transformers" / scenario / "certify" / "straight" / f).read_bytes() == \
                (built / "transformers" / "mid_epoch" / "certify" / "straight" / f).read_bytes()
    assert record("ddp2")["window"] != record("mid_epoch")["window"]
    assert record("ddp2", "own")["window"] != record("mid_epoch", "own")["window"]  # own: its cell's own config


@pytest.mark.slow
@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_each_negative_control_is_caught_at_the_first_step_after_the_cut(built, framework):
    """Catches: a certificate blind to the optimizer state (an emptied AdamW would pass as exact), or a control
    that changed something besides the optimizer state."""
    cell = json.loads((built / framework / SCENARIO / "cell.json").read_text())
    runs = built / framework / SCENARIO / "certify"
    straight, emptied = rows(runs / "straight"), rows(runs / "control")
    assert min(emptied) == CUT + 1
    # read here: the data, gradients and LR match (the cell's repairs restored what the framework does not), the
    # optimizer state does not (an RNG state may differ before it: a draw nothing used)
    differing_pieces = differing(straight[CUT + 1], emptied[CUT + 1], unseeded(straight, rows(runs / "stopped")))
    computed = [p for p in differing_pieces if not p.startswith("rng_")]
    assert computed and computed[0] == "optimizer", differing_pieces
    control = cell["control"]
    assert control["caught"] and (control["first_step"], control["first_state"]) == (CUT + 1, "optimizer")


@pytest.mark.slow
def test_every_number_in_the_audit_summary_is_recomputed_from_the_files(built):
    """Catches: a summary whose counts or controls are typed, stale, or computed from another cell."""
    summary = (built / "summary.md").read_text()
    cells = {(f, sc): built / f / sc for f, sc in CELLS if sc in SCENARIOS}
    exact = sum(judged_from_files(c / "certify", sc, False)["exact"] for (_, sc), c in cells.items())
    caught = 0
    for f in FRAMEWORKS:
        runs = built / f / SCENARIO / "certify"
        straight, control = rows(runs / "straight"), rows(runs / "control")
        ignore = unseeded(straight, rows(runs / "stopped"))
        caught += [p for p in differing(straight[CUT + 1], control[CUT + 1], ignore)
                   if not p.startswith("rng_")][:1] == ["optimizer"]
    repaired = sum(json.loads((c / "cell.json").read_text())["repair_exact"] is True for c in cells.values())
    found = re.search(r"(\d+) of (\d+) cells bit-exact; (\d+) more exact", summary)
    assert found and tuple(map(int, found.groups())) == (exact, len(cells), repaired)
    controls = re.search(r"(\d+) of (\d+) caught at the first step after the cut", summary)
    assert controls and controls.groups() == (str(caught), str(len(FRAMEWORKS)))
    matrix = (built / "matrix.csv").read_text().splitlines()
    assert matrix[0] == ",".join(audit.COLUMNS) and len(matrix) == 1 + len(cells)
    assert f"torch {torch.__version__.split('+')[0]}" in summary
    assert (built / "matrix.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# Two environments of the audit across releases: the Trainer (this environment's transformers) on two
# releases of accelerate, which its resume goes through (skip_first_batches, the prepared loader's sampler)
PAIR = {"transformers": audit.version("transformers"), "accelerate": ("1.14.0", audit.version("accelerate")),
        "scenario": "second_epoch"}


@pytest.mark.slow
def test_two_releases_of_the_package_a_resume_goes_through_are_told_apart_and_tabled(built):
    """Catches: a release cell run in this environment instead of its own venv (what each venv imports is read
    back here, and the certificate names its interpreter), a row naming the wrong release or leaving out the
    package the resume goes through, a verdict the certificates do not support, a first release exact that
    does not follow from the two verdicts, releases out of order in the CSV."""
    work = built.parent.parent
    releases = [f"transformers=={PAIR['transformers']} accelerate=={v}" for v in PAIR["accelerate"]]
    (work / "releases.yaml").write_text(yaml.safe_dump({"audit_releases": {
        "scenarios": [PAIR["scenario"]], "envs": str(work / "envs"),
        "releases": {"transformers": releases, "accelerate": [], "lightning": []}}}))
    snakemake(work, "audit_releases", configfiles=("config.yaml", "tiny.yaml", "audit.yaml", "releases.yaml"))
    exact = []
    for requirements, accelerate in zip(releases, PAIR["accelerate"]):
        name = audit.release_name(requirements)
        python = work / "envs" / name / "bin" / "python"
        imported = subprocess.run([python, "-c", "import accelerate, transformers, torch; print(accelerate.__file__, "
                                   "accelerate.__version__, transformers.__version__, torch.__version__)"],
                                  capture_output=True, text=True, check=True).stdout.split()
        # a release this environment already has comes from it (the venv is laid over it); any other, its own
        own = accelerate == audit.version("accelerate")
        assert imported[0].startswith(str(work / "envs" / name)) != own and imported[3] == torch.__version__
        assert imported[1:3] == [accelerate, PAIR["transformers"]]
        cell_dir = built / "releases" / name / "transformers" / PAIR["scenario"]
        cell = json.loads((cell_dir / "cell.json").read_text())
        assert (cell["version"], cell["with"]) == (PAIR["transformers"], f"accelerate {accelerate}")
        assert str(python) in json.loads((cell_dir / "certify" / "verdict.json").read_text())["command"]
        found = judged_from_files(cell_dir / "certify", PAIR["scenario"], cell["repair_exact"] is True)
        assert cell["exact"] == found["exact"] and (found["exact"] or cell["first_step"] == found["first"][0])
        exact.append(found["exact"])
    labels = [f"{PAIR['transformers']} (accelerate {v})" for v in PAIR["accelerate"]]
    first = {(True, True): f"{labels[0]} or earlier", (False, True): labels[1]}.get(tuple(exact), "none yet (")
    assert f"| transformers | {first}" in (built / "releases.md").read_text()
    csv_rows = (built / "releases.csv").read_text().splitlines()
    assert csv_rows[0].split(",")[:8] == ["framework", "version", "with", "torch", "scenario", "exact", "first_step",
                                          "first_piece"]
    assert [r.split(",")[2] for r in csv_rows[1:]] == [f"accelerate {v}" for v in PAIR["accelerate"]]
    assert (built / "releases.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.quick
def test_the_first_release_exact_is_the_oldest_after_which_every_release_is_exact():
    """Catches: the first exact release taken for the fix when a later release broke again, releases ordered
    as strings (1.10 before 1.9) or without the package a resume goes through, a failed release counted as
    exact, a framework never exact called fixed."""
    def row(version, exact, with_="", cause=""):
        return {"framework": "accelerate", "version": version, "with": with_, "torch": "2.13.0",
                "scenario": SCENARIO, "exact": exact, "repair_exact": "", "cause": cause,
                "first_step": "" if exact else 4, "first_state": "" if exact else "samples"}

    # listed out of order: 0.9 exact, 1.9 not (a regression), 1.10 exact, 1.11 exact
    rows = [row("1.10.0", True), row("0.9.0", True), row("1.11.0", True), row("1.9.0", False)]
    assert audit.first_exact(sorted(rows, key=audit.release_order)) == "1.10.0"
    assert audit.first_exact(sorted(rows[:3], key=audit.release_order)) == "0.9.0 or earlier"
    failed = [row("1.9.0", True), row("1.10.0", False, cause="resume failed: boom")]
    assert audit.first_exact(failed).startswith("none yet (1.10.0: ")
    skipped = [row("1.8.0", False, cause="skipped: needs torch 2.1"), row("1.9.0", True)]
    assert audit.first_exact(skipped) == "1.9.0 or earlier"  # a release that could not run proves nothing
    # the package a resume goes through orders releases of the same framework version
    pair = [row("5.23.0", True, "accelerate 1.15.0"), row("5.23.0", False, "accelerate 1.14.0")]
    assert audit.first_exact(sorted(pair, key=audit.release_order)) == "5.23.0 (accelerate 1.15.0)"
    table = audit.releases_table(rows + [{**r, "scenario": "epoch_end", "exact": True} for r in rows])
    assert "| accelerate | 1.10.0 | 0.9.0 or earlier |" in table


@pytest.mark.quick
def test_a_refused_resume_or_a_scenario_the_script_cannot_run_is_the_cells_result(monkeypatch, tmp_path):
    """Catches: a framework's failing resume that stops the whole audit, or a cell that then claims a verdict;
    any other failure (a straight run that fails) passed off as a cell's result; a scenario a script cannot run
    that is run anyway or counted as a verdict. The failures are told apart by their type (certkit.errors),
    never by their text: a resume whose last line reads like another failure is still the cell's result."""
    audit_cell = script_module("audit_cell.py")
    from certkit.errors import ResumeFailed, StraightFailed

    def refused(*args, **kwargs):
        raise kind(why)

    monkeypatch.setattr(audit_cell, "certify", refused)
    argv = ["audit_cell.py", "--framework", "accelerate", "--scenario", SCENARIO, "--script", "x.py",
            "--settings", "s.yaml", "--cell", str(tmp_path)]
    monkeypatch.setattr(sys, "argv", argv)
    kind, why = ResumeFailed, "resume failed: the straight run failed (exit 1), its own log says"
    audit_cell.main()
    cell = json.loads((tmp_path / "cell.json").read_text())
    assert cell["cause"] == why and audit.verdict(cell) == "failed" and cell["exact"] is False
    kind, why = StraightFailed, "resume failed: boom"  # the text of the other kind: the type decides
    (tmp_path / "cell.json").unlink()
    with pytest.raises(UserError, match="boom"):
        audit_cell.main()
    assert not (tmp_path / "cell.json").exists()
    # a scenario the script has no way to run: the cell says so and runs nothing (certify would raise here)
    monkeypatch.setattr(sys, "argv", [*argv[:2], "own", "--scenario", "random_collator", *argv[5:]])
    audit_cell.main()
    cell = json.loads((tmp_path / "cell.json").read_text())
    assert audit.verdict(cell) == "unsupported" and cell["cause"].startswith("not supported: run.py")


@pytest.mark.quick
def test_a_control_is_caught_only_in_the_optimizer_at_the_step_after_the_cut_and_an_unjudgeable_one_is_not():
    """Catches: a control called caught at another step or in another piece (a weight changed later is no
    proof that the certificate sees the optimizer), a control run that fails passed off as caught, a control
    run without the repairs its cell needed, a summary that counts controls it did not check; a control whose
    resume already differs at the step after the cut (its optimizer state too) called caught or NOT caught:
    it is inconclusive, and not run."""
    from certkit import recorder, runs

    straight = {0: {s: {"rank": 0, "step": s, **{p: f"{p}@{s}" for p in recorder.PIECES}} for s in range(1, 7)}}
    found = {"stop_after": 3, "last_step": 6, "not_compared": [], "repair": {"restored": ["samples"]}}
    exact = {0: {s: dict(straight[0][s]) for s in range(4, 7)}}  # the repaired run, not emptied
    lossy = {0: {s: {**straight[0][s], "params_in": "fp16", "optimizer": "other", "params": "other"}
                 for s in range(4, 7)}}

    def control_run(step, piece, code=0):
        def run(pieces):
            assert pieces == ["samples"]  # the cell's repairs are put back, so only the emptied optimizer is left
            rows = {0: {s: dict(straight[0][s]) for s in range(4, 7)}}
            rows[0][step][piece] = "emptied"
            return code, rows, {}
        return run

    def never_run(pieces):
        raise AssertionError("a control that cannot be judged was run")

    cases = [(4, "optimizer", 0), (4, "params", 0), (5, "optimizer", 0), (4, "optimizer", 1)]
    outcomes = {case: runs.controlled(found, straight, control_run(*case), exact) for case in cases}
    assert [o["caught"] for o in outcomes.values()] == [True, False, False, None]
    assert [o["outcome"] for o in outcomes.values()] == ["caught", "not caught", "not caught", "inconclusive"]
    assert "failed" in outcomes[4, "optimizer", 1]["why"]
    unjudged = runs.controlled(found, straight, never_run, lossy)
    assert (unjudged["outcome"], unjudged["caught"]) == ("inconclusive", None)
    assert "already differs at step 4, rank 0 (the parameters the step starts from)" in unjudged["why"]
    controls = [audit.control_of(f, {"stop_after": 3, "control": control})
                for f, control in (("own", outcomes[4, "optimizer", 0]), ("accelerate", outcomes[4, "params", 0]),
                                   ("lightning", unjudged))]
    rows = [{"framework": f, "version": "-", "torch": "2", "scenario": SCENARIO, "exact": True, "repair_exact": "",
             "cause": "", "first_step": "", "first_state": ""} for f in ("own", "accelerate", "lightning")]
    assert "1 of 3 caught at the first step after the cut" in audit.summary_table(rows, controls, {})
    assert "lightning: inconclusive" in audit.summary_table(rows, controls, {})
    section = audit.report_section(rows, controls)
    assert "accelerate: first difference" in section and "NOT caught" in section
    assert "lightning: inconclusive (the repaired run already differs at step 4" in section


@pytest.mark.slow
def test_an_unknown_framework_in_the_config_is_one_line_naming_the_key(built):
    """Catches: a typo in audit.frameworks that silently audits nothing, or fails with a traceback."""
    work = built.parent.parent
    (work / "bad_audit.yaml").write_text(yaml.safe_dump({"audit": {"frameworks": ["own", "deepspeed"],
                                                                  "scenarios": [SCENARIO]}}))
    proc = snakemake(work, "-n", "audit", configfiles=("config.yaml", "tiny.yaml", "bad_audit.yaml"), check=False)
    assert proc.returncode != 0
    assert "config key 'audit.frameworks.1'" in proc.stdout + proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr


@pytest.mark.quick
def test_a_framework_that_is_not_installed_is_one_line_with_the_install_command(monkeypatch):
    """Catches: a missing package that surfaces as an ImportError traceback deep inside an example script."""
    monkeypatch.setitem(audit.PACKAGES, "lightning", f"no-such-package-{random.randrange(10**6)}")
    with pytest.raises(UserError, match=r"needs the package no-such-package-\d+: pip install"):
        audit.require("lightning")


@pytest.mark.quick
def test_a_crash_cell_resumes_through_the_frameworks_auto_resume_and_is_counted_apart(monkeypatch, tmp_path):
    """Catches: a crash cell that names the checkpoint to resume from (then no crash could make the framework
    pick a wrong one), Lightning's auto-resume without the last.ckpt it reads, the counts of certify --crash
    lost or shifted between outcomes in the summary, and a crash cell counted among the bit-exact ones."""
    audit_cell = script_module("audit_cell.py")
    from certkit.saves import MODELS, OUTCOMES

    calls = []
    counts = {m: {o: 10 * i + j for j, o in enumerate(OUTCOMES)} for i, m in enumerate(MODELS)}

    def crash(command, resume, out, stop_after, max_points):
        calls.append((command, resume, stop_after))
        return {"exact": False, "counts": counts, "events": 13, "states": 41, "resumed": 16}

    monkeypatch.setattr(audit_cell, "certify_crash", crash)
    for framework in ("transformers", "accelerate", "lightning"):
        (tmp_path / framework).mkdir()
        monkeypatch.setattr(sys, "argv", ["audit_cell.py", "--framework", framework, "--scenario", "crash", "--script",
                                          "x.py", "--settings", "s.yaml", "--cell", str(tmp_path / framework)])
        audit_cell.main()
    for command, resume, stop_after in calls:
        assert "{step}" not in resume and "{run}" not in resume and stop_after == audit.SCENARIOS["crash"].crash
    assert [c[1] for c in calls] == ["--resume_from_checkpoint true", "--resume_from_checkpoint latest",
                                     "--ckpt_path last"]
    assert "--save_last" in calls[2][0] and "--save_last" not in calls[0][0]
    cell = json.loads((tmp_path / "lightning" / "cell.json").read_text())
    assert audit.verdict(cell) == "crash"
    plain = {"framework": "lightning", "version": "2", "torch": "2", "scenario": SCENARIO, "exact": True,
             "repair_exact": "", "cause": "", "first_step": "", "first_state": ""}
    summary = audit.summary_table([plain, cell], [], {})
    assert "1 of 1 cells bit-exact" in summary
    # each model's counts in OUTCOMES' order: exact, lost work, started over, hard fail, silent
    assert "| lightning | 1 | 13 | 41 (16) | 0 / 1 / 2 / 3 / 4 | 10 / 11 / 12 / 13 / 14 |" in summary
    assert "**60 crash points fail**" in summary  # all but the exact ones: 1+2+3+4 + 11+12+13+14


@pytest.mark.quick
def test_each_cell_that_is_not_exact_shows_its_diagnosed_cause_in_a_column_of_its_own():
    """Catches: certify's diagnosis dropped on the way from the verdict to the cell's row, matrix.csv or the
    summary (a cell that is not exact must say why, as certify said it), or shown for an exact cell."""
    found = {"deterministic": True, "max_abs_dw": 0.5, "exact": False, "again": 0, "ranks": None,
             "first": {"step": 5, "rank": 0, "piece": "samples"}, "repair": {},
             "diagnosis": {"step": 5, "rank": 0, "compared": [], "causes": [
                 {"class": "rng_reseeded", "title": "RNG reseeded, not restored", "evidence": "e",
                  "where": "train.py:31 torch.randint", "fix": "f"},
                 {"class": "data_position", "title": "Data position", "evidence": "e", "where": None, "fix": "f"}]}}
    row = audit.row_of("lightning", SCENARIO, found)
    assert row["diagnosis"] == "RNG reseeded, not restored (train.py:31 torch.randint); Data position"
    assert "diagnosis" in audit.COLUMNS
    exact = audit.row_of("own", SCENARIO, {**found, "exact": True, "max_abs_dw": 0.0, "first": None,
                                            "diagnosis": None})
    assert exact["diagnosis"] == ""
    summary = audit.summary_table([exact, row], [], {})
    assert (f"| lightning | {SCENARIO} | step 5: samples | RNG reseeded, not restored "
            "(train.py:31 torch.randint); Data position |") in summary
    assert f"| own | {SCENARIO} |" not in summary.split("Not exact, and why")[1]

"""The audit of other trainers: each framework's plain mid-epoch cell, built by `snakemake audit` on the tiny
pipeline; the certificate against divergences planted on purpose; the negative controls; the summary's numbers
recomputed from the files; bad input.

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
from conftest import SCRIPTS, assert_same_state_dict, clean_env, copy_workflow, same_state_dict, snakemake

from mmkit import audit
from mmkit.errors import UserError

FRAMEWORKS = ["own", "transformers", "accelerate", "lightning"]
SCENARIO = "mid_epoch"
CUT = audit.SCENARIOS[SCENARIO].cut


@pytest.fixture(scope="module")
def built(pristine_pipeline, tmp_path_factory):
    """The audit of every framework in the plain mid-epoch scenario (and each framework's negative control),
    added to a copy of the tiny pipeline of its own (its jobs' logs would join the pipeline's); returns its
    audit folder."""
    work = tmp_path_factory.mktemp("audit") / "copy"
    shutil.copytree(pristine_pipeline, work, symlinks=True)
    copy_workflow(work)
    (work / "audit.yaml").write_text(yaml.safe_dump({"audit": {"frameworks": FRAMEWORKS, "scenarios": [SCENARIO]}}))
    snakemake(work, "audit", configfiles=("config.yaml", "tiny.yaml", "audit.yaml"))
    return work / "results" / "audit"


def rows(path) -> list:
    return [json.loads(line) for line in path.read_text().splitlines()]


def weights(path) -> dict:
    return torch.load(path, weights_only=True)


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_each_framework_resumes_through_its_own_resume_and_the_cell_says_how_exactly(built, framework):
    """Catches: a cell that calls a resume exact when a tensor differs (or the reverse), a first difference
    that is not the first, a resume that did not start right after the cut, a repair that was not exact."""
    cell_dir = built / framework / SCENARIO
    cell = json.loads((cell_dir / "cell.json").read_text())
    straight, resumed = rows(cell_dir / "straight/certificate.jsonl"), rows(cell_dir / "resumed/certificate.jsonl")
    assert [r["step"] for r in straight] == list(range(1, audit.STEPS + 1))
    assert [r["step"] for r in resumed] == list(range(CUT + 1, audit.STEPS + 1))  # a new process, from the cut
    identical = same_state_dict(weights(cell_dir / "straight/weights.pt"), weights(cell_dir / "resumed/weights.pt"))
    assert cell["exact"] == (identical and straight[CUT:] == resumed)
    if cell["exact"]:
        return
    # the first differing step and piece, found here by reading the two certificates
    step = next(r["step"] for s, r in zip(straight[CUT:], resumed) if s != r)
    piece = next(p for p in audit.PIECES if straight[step - 1][p] != resumed[step - CUT - 1][p])
    assert (cell["first_step"], cell["first_state"]) == (step, piece)
    assert cell["repair_exact"] is True, cell  # today every plain mid-epoch cell is explained by a repair


def test_a_straight_run_of_each_adapter_is_deterministic(built, tmp_path):
    """Catches: an adapter whose straight run draws something unseeded (its weights or any certificate row
    differ between two processes), which would make every cell of its framework meaningless; and a run forked
    by the cell (mmkit.audit.Runs) that is not what a new interpreter computes: this one is a plain process."""
    settings, tokens = built.parent / "settings" / "audit.yaml", built.parent / "data" / "train.npy"
    for framework in FRAMEWORKS:
        out = tmp_path / framework
        out.mkdir()
        proc = subprocess.run([sys.executable, str(SCRIPTS / f"audit_{framework}.py"), "--settings", settings,
                               "--tokens", tokens, "--scenario", SCENARIO, "--mode", "straight",
                               "--checkpoints", out / "checkpoints", "--certificate", out / "certificate.jsonl",
                               "--weights", out / "weights.pt"], capture_output=True, text=True, env=clean_env())
        assert proc.returncode == 0, proc.stderr[-1500:]
        first = built / framework / SCENARIO / "straight"
        assert rows(out / "certificate.jsonl") == rows(first / "certificate.jsonl"), framework
        assert_same_state_dict(weights(out / "weights.pt"), weights(first / "weights.pt"))


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_each_negative_control_is_caught_at_the_first_step_after_the_cut(built, framework):
    """Catches: a certificate blind to the optimizer state (an emptied AdamW would pass as exact)."""
    control = json.loads((built / framework / "control.json").read_text())
    straight = rows(built / framework / SCENARIO / "straight/certificate.jsonl")
    emptied = rows(built / framework / "control.jsonl")
    assert emptied[0]["step"] == CUT + 1
    first_row = emptied[0]
    # read here: the data, LR and RNG match (the cell's repairs restored what the framework does not), the
    # optimizer state does not
    differing = [p for p in audit.PIECES if first_row[p] != straight[CUT][p]]
    assert differing and differing[0] == "optimizer", differing
    assert control["caught"] and (control["first_step"], control["first_state"]) == (CUT + 1, "optimizer")


def train_with_certificate(plant=None) -> list:
    """Five steps of the audit's model, with an extra RNG draw or a skipped batch at step 3 when PLANT says so."""
    data = audit.Windows(torch.arange(audit.SAMPLES * audit.SEQ_LEN) % 500)
    model = audit.build_model(audit.SCENARIOS["dropout"], 512, seed=3)
    optimizer = torch.optim.AdamW(model.parameters(), lr=audit.LR)
    order = torch.randperm(audit.SAMPLES, generator=torch.Generator().manual_seed(3)).view(-1, audit.BATCH_SIZE)
    certificate, batches = audit.Certificate(), iter(order.tolist())
    for step in range(1, 6):
        if step == 3 and plant == "rng":
            torch.rand(1)
        if step == 3 and plant == "skip":
            next(batches)
        batch = audit.collate([data[i] for i in next(batches)])
        model(input_ids=batch["input_ids"], labels=batch["labels"])["loss"].backward()
        optimizer.step()
        optimizer.zero_grad()
        certificate.record(step, batch["idx"].tolist(), audit.LR, model, optimizer)
    return certificate.rows


@pytest.mark.parametrize("plant, piece", [("rng", "rng_torch"), ("skip", "samples")])
def test_the_certificate_names_a_divergence_planted_on_purpose(plant, piece):
    """Catches: a certificate that misses one extra RNG draw or one skipped batch, or names a consequence
    (the weights) instead of the cause."""
    plain, planted = train_with_certificate(), train_with_certificate(plant)
    assert plain[:2] == planted[:2]
    assert audit.first_difference(plain, planted, range(1, 6)) == (3, piece)


def test_every_number_in_the_audit_summary_is_recomputed_from_the_files(built):
    """Catches: a summary whose counts or controls are typed, stale, or computed from another cell."""
    summary = (built / "summary.md").read_text()
    cells = [built / f / SCENARIO for f in FRAMEWORKS]
    exact = sum(same_state_dict(weights(c / "straight/weights.pt"), weights(c / "resumed/weights.pt"))
                and rows(c / "straight/certificate.jsonl")[CUT:] == rows(c / "resumed/certificate.jsonl")
                for c in cells)
    repaired = sum(json.loads((c / "cell.json").read_text())["repair_exact"] is True for c in cells)
    found = re.search(r"(\d+) of (\d+) cells bit-exact; (\d+) more exact", summary)
    assert found and tuple(map(int, found.groups())) == (exact, len(cells), repaired)
    controls = re.search(r"(\d+) of (\d+) caught at the first step after the cut", summary)
    assert controls and controls.groups() == (str(len(FRAMEWORKS)), str(len(FRAMEWORKS)))
    matrix = (built / "matrix.csv").read_text().splitlines()
    assert matrix[0] == ",".join(audit.COLUMNS) and len(matrix) == 1 + len(cells)
    assert f"torch {torch.__version__.split('+')[0]}" in summary
    assert (built / "matrix.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_truncated_checkpoint_at_resume_is_the_frameworks_error_in_the_cell(built, tmp_path):
    """Catches: a damaged framework checkpoint that crashes the DAG, or is resumed as if whole."""
    stopped = tmp_path / "checkpoints"
    shutil.copytree(built / "accelerate" / SCENARIO / "stopped/checkpoints", stopped)
    model_file = next(stopped.rglob("model.safetensors"))
    model_file.write_bytes(model_file.read_bytes()[:100])
    out = tmp_path / "resumed"
    out.mkdir()
    proc = subprocess.run([sys.executable, str(SCRIPTS / "audit_accelerate.py"),
                           "--settings", built.parent / "settings" / "audit.yaml",
                           "--tokens", built.parent / "data" / "train.npy", "--scenario", SCENARIO, "--mode", "resumed",
                           "--checkpoints", out / "checkpoints", "--resume-from", stopped,
                           "--certificate", out / "certificate.jsonl", "--weights", out / "weights.pt"],
                          capture_output=True, text=True, env=clean_env())
    assert proc.returncode == 0, proc.stderr[-1500:]
    (failed,) = rows(out / "certificate.jsonl")
    assert failed["failed"].startswith("resume failed: ") and "Traceback" not in proc.stderr


def test_an_unknown_framework_in_the_config_is_one_line_naming_the_key(built):
    """Catches: a typo in audit.frameworks that silently audits nothing, or fails with a traceback."""
    work = built.parent.parent
    (work / "bad_audit.yaml").write_text(yaml.safe_dump({"audit": {"frameworks": ["own", "deepspeed"],
                                                                  "scenarios": [SCENARIO]}}))
    proc = snakemake(work, "-n", "audit", configfiles=("config.yaml", "tiny.yaml", "bad_audit.yaml"), check=False)
    assert proc.returncode != 0
    assert "config key 'audit.frameworks.1'" in proc.stdout + proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr


def test_a_framework_that_is_not_installed_is_one_line_with_the_install_command(monkeypatch):
    """Catches: a missing package that surfaces as an ImportError traceback deep inside the adapter."""
    monkeypatch.setitem(audit.PACKAGES, "lightning", f"no-such-package-{random.randrange(10**6)}")
    with pytest.raises(UserError, match=r"needs the package no-such-package-\d+: pip install"):
        audit.require("lightning")

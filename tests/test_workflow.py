"""The workflow as a user drives it: the plan, one target rebuilt alone, config errors, lint."""

import os
import re
import subprocess
import sys

import pytest
import torch
import yaml
from conftest import REPO, TINY, copy_workflow, snakemake

ARTIFACTS = ["straight.pth", "straight_log.csv", "resume.pth", "resumed.pth", "resumed_log.csv", "noopt.pth",
             "summary.md", "inference/model.safetensors", "inference/config.json", "nosched.pth", "halfresume.pth",
             "resume_fp16.pth", "straight_bf16.pth", "bf16.json", "plots/loss.png", "plots/loss_gap.png",
             "noskip.pth", "straight_fp16.pth", "fp16.json", "optim.json", "divergence.csv", "report.md"]


def planned_jobs(proc) -> dict:
    """{rule: count} from the job-stats table of a dry run."""
    table = proc.stdout.split("Job stats:")[1].split("total")[0]
    return {m[1]: int(m[2]) for m in re.finditer(r"^(\w+)\s+(\d+)$", table, re.M)}


@pytest.fixture
def fresh(tmp_path):
    work = copy_workflow(tmp_path / "wf")
    (work / "tiny.yaml").write_text(yaml.safe_dump({**TINY, "outdir": "results"}))
    return work


@pytest.mark.quick
def test_dry_run_plans_every_artifact_once(fresh):
    proc = snakemake(fresh, "-n")
    jobs = planned_jobs(proc)
    expected = {"settings_table", "tokenize", "straight", "resume", "resumed", "noopt", "noskip",
                "fp16", "bf16", "inference", "optim", "divergence", "report", "all", "nosched",
                "halfresume", "resume_fp16", "plots"}
    assert expected <= jobs.keys() and all(jobs[r] == 1 for r in expected)
    assert jobs["settings"] == 7  # one settings file per entry of READS
    for name in ARTIFACTS:
        assert f"results/{name}" in proc.stdout
    assert not (fresh / "results").exists()  # a dry run makes nothing


def test_rulegraph_has_the_experiments_edges(fresh):
    dot = snakemake(fresh, "--rulegraph").stdout
    names = dict(re.findall(r'(\d+)\[label = "(\w+)"', dot))
    edges = {(names[a], names[b]) for a, b in re.findall(r"(\d+) -> (\d+)", dot)}
    for edge in [("tokenize", "straight"), ("tokenize", "resume"), ("resume", "resumed"), ("resume", "noopt"),
                 ("resume", "noskip"), ("resume", "optim"), ("straight", "fp16"), ("divergence", "report"),
                 ("fp16", "report"), ("optim", "report")]:
        assert edge in edges, edge
    assert ("straight", "resumed") not in edges  # the resumed run never sees the straight run


def test_all_artifacts_built_and_nothing_left_to_do(pipeline):
    for name in ARTIFACTS:
        assert (pipeline / name).stat().st_size > 0
    proc = snakemake(pipeline.parent, "-n")
    assert "Nothing to be done" in proc.stdout + proc.stderr


def test_rebuilding_one_target_runs_only_that_rule_and_gives_the_same_bits(pipeline):
    work = pipeline.parent
    before = torch.load(pipeline / "noopt.pth", weights_only=True)
    (pipeline / "noopt.pth").unlink()
    plan = planned_jobs(snakemake(work, "-n", "results/noopt.pth"))
    assert plan == {"noopt": 1}
    snakemake(work, "results/noopt.pth")
    after = torch.load(pipeline / "noopt.pth", weights_only=True)
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_editing_the_training_code_reruns_the_training_rules(pipeline):
    train_py = pipeline.parent / "src" / "mmkit" / "train.py"
    text, stat = train_py.read_text(), train_py.stat()
    try:
        # a real edit: snakemake ignores a newer mtime when the file's checksum is unchanged
        train_py.write_text(text + "\n# edited\n")
        plan = planned_jobs(snakemake(pipeline.parent, "-n"))
    finally:
        train_py.write_text(text)
        os.utime(train_py, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert {"straight", "resume", "resumed", "noopt", "noskip"} <= plan.keys()
    assert "tokenize" not in plan and "settings" not in plan


@pytest.mark.parametrize(
    "overlay, key",
    [
        ({"stop_at": 12}, "stop_at"),
        ({"stop_at": 0}, "stop_at"),
        ({"lr": -0.1}, "lr"),
        ({"lr": float("nan")}, "'lr': nan is not a finite number"),
        ("lr: 0.001\nlr: 0.002\n", "key 'lr' is written twice (lines 1 and 2)"),  # a file Snakemake's YAML takes
        ({"model": {**TINY["model"], "num_attention_heads": 3}}, "num_attention_heads"),
        ({"model": {**TINY["model"], "num_key_value_heads": 3}}, "num_key_value_heads"),
        ({"device": "tpu"}, "device"),
        ({"threads": 0}, "threads"),
        ({"batch_size": "eight"}, "batch_size"),
        ({"parallel": {"world_size": 3, "strategy": "ddp", "backend": "auto", "batch_slices": None}}, "batch_size"),
        ({"parallel": {"world_size": 2, "strategy": "ddp", "backend": "auto", "batch_slices": 3}}, "batch_slices"),
        ({"parallel": {"world_size": 2, "strategy": "zero3", "backend": "auto", "batch_slices": None}}, "strategy"),
        ({"parallel": {"world_size": 1, "strategy": "ddp", "backend": "nccl", "batch_slices": None}}, "backend"),
        ({"parallel": {"world_size": 2, "strategy": "fsdp2", "backend": "auto", "batch_slices": None}}, "strategy"),
    ],
)
def test_bad_config_stops_before_any_job_naming_the_key(fresh, overlay, key):
    (fresh / "bad.yaml").write_text(overlay if isinstance(overlay, str) else yaml.safe_dump(overlay))
    proc = snakemake(fresh, configfiles=("config.yaml", "tiny.yaml", "bad.yaml"), check=False)
    assert proc.returncode != 0
    assert key in proc.stderr + proc.stdout
    assert not (fresh / "results").exists()


def test_snakemake_lint_is_clean():
    proc = subprocess.run([sys.executable, "-m", "snakemake", "--lint"], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_snakefmt_check_is_clean():
    proc = subprocess.run([sys.executable, "-m", "snakefmt", "--check", "Snakefile", "workflow/rules"],
                          cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_own_token_files_skip_the_tokenizer(fresh, pipeline):
    overlay = {"data": {"corpus": None, "val_fraction": 0.1,
                        "train_tokens": str(pipeline / "data" / "train.npy"),
                        "val_tokens": str(pipeline / "data" / "val.npy")}}
    (fresh / "own.yaml").write_text(yaml.safe_dump(overlay))
    proc = snakemake(fresh, "-n", configfiles=("config.yaml", "tiny.yaml", "own.yaml"))
    plan = planned_jobs(proc)
    assert "tokenize" not in plan and "straight" in plan
    assert str(pipeline / "data" / "train.npy") in proc.stdout


def test_naming_only_one_token_file_is_refused(fresh, pipeline):
    (fresh / "own.yaml").write_text(yaml.safe_dump({"data": {
        "corpus": None, "val_fraction": 0.1, "train_tokens": str(pipeline / "data" / "train.npy"), "val_tokens": None}}))
    proc = snakemake(fresh, "-n", configfiles=("config.yaml", "tiny.yaml", "own.yaml"), check=False)
    assert proc.returncode != 0 and "data.val_tokens" in proc.stdout + proc.stderr


@pytest.mark.parametrize("preset, millions", [("minimind2-small", 25.8), ("minimind3-small", 63.9)])
def test_the_size_presets_are_the_real_sizes(fresh, preset, millions):
    """MiniMind2-small as published (25.8M), MiniMind-3's dense model (published as 64M; 63,912,192 by the
    upstream MiniMindConfig's defaults). And the count a cluster's memory request is sized by, computed from
    the dims without torch (mmkit.config.parameter_count), is the built model's: catches the two drifting
    apart for either architecture."""
    from mmkit.config import load_config, model_config, parameter_count
    from mmkit.model import MiniMindForCausalLM

    merged = yaml.safe_load((REPO / "config.yaml").read_text())
    overlay = yaml.safe_load((REPO / "presets" / f"{preset}.yaml").read_text())
    merged.update({**overlay, "model": {**merged["model"], **overlay["model"]}})
    (fresh / "merged.yaml").write_text(yaml.safe_dump(merged))
    params = MiniMindForCausalLM(model_config(load_config(fresh / "merged.yaml"))).num_parameters()
    assert round(params / 1e6, 1) == millions
    assert parameter_count(merged["model"]) == params
    plan = planned_jobs(snakemake(fresh, "-n", configfiles=("config.yaml", f"presets/{preset}.yaml")))
    assert plan["straight"] == 1

"""Shared fixtures: a copy of the workflow in a temporary directory and one tiny end-to-end run of it.

Tests run the real scripts in real processes, as a user would; the tiny overlay changes steps,
stop_at and every model dimension, so the bit-exact claim is checked off the default config too.
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = REPO / "workflow" / "scripts"
sys.path.insert(0, str(SCRIPTS))

TINY = {
    "steps": 12,
    "stop_at": 5,
    "batch_size": 4,
    "seq_len": 32,
    "model": {
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 512,
    },
}


def copy_workflow(dest: Path) -> Path:
    """The files a fresh clone has, without results or snakemake state."""
    dest.mkdir(parents=True, exist_ok=True)
    for name in ("Snakefile", "config.yaml", "environment.yml", "presets"):
        src = REPO / name
        (shutil.copytree if src.is_dir() else shutil.copy2)(src, dest / name)
    shutil.copytree(REPO / "workflow", dest / "workflow", ignore=shutil.ignore_patterns("__pycache__"))
    return dest


def tiny_config(**overrides) -> dict:
    """The repository's config.yaml with the tiny overlay (and overrides) deep-merged in."""
    cfg = yaml.safe_load((REPO / "config.yaml").read_text())
    for layer in (TINY, overrides):
        for k, v in layer.items():
            cfg[k] = {**cfg[k], **v} if isinstance(v, dict) else v
    return cfg


def snakemake(workdir: Path, *args, configfiles=("config.yaml", "tiny.yaml"), check=True):
    # targets before --configfile, which takes every word after it
    cmd = [sys.executable, "-m", "snakemake", "--cores", "2", *args, "--configfile", *configfiles]
    proc = subprocess.run(cmd, cwd=workdir, capture_output=True, text=True, env=clean_env())
    if check and proc.returncode != 0:
        raise AssertionError(f"snakemake {' '.join(args)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc


def clean_env() -> dict:
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"  # rules call `python`
    return env


def run_script(name: str, *args, cwd=None):
    """Run workflow/scripts/NAME as a separate process; returns the CompletedProcess."""
    return subprocess.run(
        [sys.executable, str(SCRIPTS / name), *map(str, args)],
        capture_output=True, text=True, cwd=cwd, env=clean_env(),
    )


@pytest.fixture(scope="session")
def pipeline(tmp_path_factory) -> Path:
    """The whole DAG run once, on the tiny overlay; returns the results directory."""
    work = copy_workflow(tmp_path_factory.mktemp("workflow"))
    (work / "tiny.yaml").write_text(yaml.safe_dump({**TINY, "outdir": "results"}))
    snakemake(work)
    return work / "results"


@pytest.fixture(scope="session")
def tiny_run(pipeline) -> dict:
    """Paths a direct run.py call needs: the resume job's settings (every training key and stop_at) and
    token files of the tiny pipeline."""
    return {
        "config": pipeline / "settings" / "resume.yaml",
        "tokens": pipeline / "data" / "train.npy",
        "val": pipeline / "data" / "val.npy",
        "resume": pipeline / "resume.pth",
    }

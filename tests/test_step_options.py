"""The training step's options (issue 14): AdamW's kernel and precision: auto.

Each changes what a step computes, so each must resume bit-exactly and be in the fingerprint.
"""

from pathlib import Path

import pytest
import torch
import yaml
from conftest import assert_same_state_dict, differences, run_script


def settings(tiny_run, tmp_path, **overrides) -> Path:
    """The tiny pipeline's resume-job settings with OVERRIDES: a job's own settings file, as run.py reads it."""
    cfg = {**yaml.safe_load(Path(tiny_run["config"]).read_text()), **overrides}
    path = tmp_path / f"{'-'.join(f'{k}_{v}' for k, v in overrides.items())}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def train(tiny_run, config, out, *args):
    proc = run_script("run.py", "--config", config, "--tokens", tiny_run["tokens"], "--out", out, *args)
    assert proc.returncode == 0, proc.stderr
    return out, proc.stderr


@pytest.mark.parametrize("adamw", ["foreach", "forloop"])
def test_each_adamw_kernel_resumes_bit_exactly_and_has_its_own_bits(pipeline, tiny_run, tmp_path, adamw):
    # catches: a kernel whose state does not survive the resume file; the setting ignored by build()
    # (then this run would equal the pipeline's, which trains with config.yaml's fused AdamW)
    config = settings(tiny_run, tmp_path, adamw=adamw)
    straight, _ = train(tiny_run, config, tmp_path / "straight.pth")
    resume, _ = train(tiny_run, config, tmp_path / "resume.pth", "--stop-at")
    resumed, _ = train(tiny_run, config, tmp_path / "resumed.pth", "--resume", resume)
    a, b = torch.load(straight, weights_only=True), torch.load(resumed, weights_only=True)
    assert_same_state_dict(a, b)
    assert torch.load(resume, weights_only=True)["fingerprint"]["adamw"] == adamw
    fused = torch.load(pipeline / "straight.pth", weights_only=True)
    assert yaml.safe_load((pipeline / "settings" / "straight.yaml").read_text())["adamw"] == "fused"
    assert differences(a, fused), f"{adamw} AdamW gave the fused kernel's bits: the setting did nothing"


def test_precision_auto_is_bf16_exactly_where_the_cpu_has_amx(tiny_run, tmp_path):
    # catches: auto reaching the fingerprint unresolved (a resume file that means another precision on
    # another machine), or resolved against the wrong flag. The flags are read here, independently.
    flags = next(line.split(":", 1)[1].split() for line in Path("/proc/cpuinfo").read_text().splitlines()
                 if line.startswith("flags"))
    expected = "bf16" if "amx_bf16" in flags else "fp32"
    out, stderr = train(tiny_run, settings(tiny_run, tmp_path, precision="auto"), tmp_path / "r.pth", "--stop-at", 2)
    assert torch.load(out, weights_only=True)["fingerprint"]["precision"] == expected
    assert f"precision: auto is {expected}" in stderr and f"amx_bf16 {'yes' if expected == 'bf16' else 'no'}" in stderr
    # and a file resumed under an explicit setting of the same precision is accepted: auto is not a precision
    train(tiny_run, settings(tiny_run, tmp_path, precision=expected), tmp_path / "r4.pth", "--resume", out,
          "--stop-at", 4)


def test_precision_auto_follows_the_amx_flag():
    # catches: auto picking bf16 on AVX512-BF16 alone, where bf16 matmuls are not faster (bench section b)
    from mmkit.hardware import resolve_precision

    assert resolve_precision("auto", "cpu", {"amx_bf16", "amx_tile", "avx512f"}) == "bf16"
    assert resolve_precision("auto", "cpu", {"avx512_bf16", "avx512f"}) == "fp32"
    assert resolve_precision("auto", "cpu", set()) == "fp32"
    assert resolve_precision("fp16", "cpu", {"amx_bf16"}) == "fp16"

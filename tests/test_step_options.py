"""The training step's options (issue 14): AdamW's kernel and precision: auto.

Each changes what a step computes, so each must resume bit-exactly and be in the fingerprint.
"""

from pathlib import Path

import pytest
import torch
import yaml
from conftest import assert_same_state_dict, differences, run_script


def settings(tiny_run, tmp_path, **overrides) -> Path:
    """The tiny pipeline's resume-job settings with OVERRIDES (model__x for model.x): a job's own settings
    file, as run.py reads it."""
    cfg = yaml.safe_load(Path(tiny_run["config"]).read_text())
    for key, value in overrides.items():
        *parents, last = key.split("__")
        d = cfg
        for parent in parents:
            d = d[parent]
        d[last] = value
    path = tmp_path / f"{'-'.join(f'{k}_{v}' for k, v in overrides.items())}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def train(tiny_run, config, out, *args):
    proc = run_script("run.py", "--config", config, "--tokens", tiny_run["tokens"], "--out", out, *args)
    assert proc.returncode == 0, proc.stderr
    return out, proc.stderr


OPTIONS = {"foreach": {"adamw": "foreach"}, "forloop": {"adamw": "forloop"},
           "explicit-attention-bf16": {"model__flash_attn": False, "precision": "bf16"}}


@pytest.mark.parametrize("option", sorted(OPTIONS))
def test_each_step_option_resumes_bit_exactly_and_has_its_own_bits(pipeline, tiny_run, tmp_path, option):
    # catches: an option whose state does not survive the resume file; an option ignored by build() or the
    # model (then this run would equal the pipeline's, trained with config.yaml's fused AdamW and SDPA)
    config = settings(tiny_run, tmp_path, **OPTIONS[option])
    straight, _ = train(tiny_run, config, tmp_path / "straight.pth")
    resume, _ = train(tiny_run, config, tmp_path / "resume.pth", "--stop-at")
    resumed, _ = train(tiny_run, config, tmp_path / "resumed.pth", "--resume", resume)
    a, b = torch.load(straight, weights_only=True), torch.load(resumed, weights_only=True)
    assert_same_state_dict(a, b)
    recorded = torch.load(resume, weights_only=True)["fingerprint"]
    for key, value in OPTIONS[option].items():
        *parents, last = key.split("__")
        assert (recorded[parents[0]] if parents else recorded)[last] == value
    default = yaml.safe_load((pipeline / "settings" / "straight.yaml").read_text())
    assert default["adamw"] == "fused" and default["model"]["flash_attn"] is True and default["precision"] == "fp32"
    assert differences(a, torch.load(pipeline / "straight.pth", weights_only=True)), \
        f"{option} gave the default step's bits: the setting did nothing"


@pytest.mark.quick
def test_attention_written_out_computes_what_sdpa_computes():
    # catches: a wrong mask (future tokens seen), a missing 1/sqrt(d), softmax over the wrong axis
    from mmkit.model import MiniMindForCausalLM, ModelConfig

    torch.manual_seed(0)
    flash = MiniMindForCausalLM(ModelConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                            num_key_value_heads=2, vocab_size=512)).eval()
    written = MiniMindForCausalLM(ModelConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                              num_key_value_heads=2, vocab_size=512, flash_attn=False)).eval()
    written.load_state_dict(flash.state_dict())
    x = torch.randint(0, 512, (2, 40))
    with torch.no_grad():
        a, b = flash(x)[0], written(x)[0]
        # causal: the first 20 positions' logits must not depend on the last 20 tokens
        cut = written(torch.cat([x[:, :20], torch.randint(0, 512, (2, 20))], 1))[0]
    assert torch.allclose(a, b, atol=1e-5), (a - b).abs().max()
    assert torch.equal(cut[:, :20], b[:, :20])


def test_precision_auto_is_bf16_exactly_where_bf16_was_measured_faster(tiny_run, tmp_path):
    # catches: auto reaching the fingerprint unresolved (a resume file that means another precision on
    # another machine), or resolved against the wrong flag. The flags are read here, independently.
    info = Path("/proc/cpuinfo").read_text().splitlines()
    flags = next(line.split(":", 1)[1].split() for line in info if line.startswith("flags"))
    vendor = next(line.split(":", 1)[1].strip() for line in info if line.startswith("vendor_id"))
    expected = "bf16" if "amx_bf16" in flags or (vendor == "AuthenticAMD" and "avx512_bf16" in flags) else "fp32"
    out, stderr = train(tiny_run, settings(tiny_run, tmp_path, precision="auto"), tmp_path / "r.pth", "--stop-at", 2)
    assert torch.load(out, weights_only=True)["fingerprint"]["precision"] == expected
    assert f"precision: auto is {expected}" in stderr and f"{vendor}: amx_bf16 " in stderr
    # and a file resumed under an explicit setting of the same precision is accepted: auto is not a precision
    train(tiny_run, settings(tiny_run, tmp_path, precision=expected), tmp_path / "r4.pth", "--resume", out,
          "--stop-at", 4)


@pytest.mark.quick
def test_precision_auto_follows_the_machines_where_bf16_was_measured_faster():
    # catches: auto picking bf16 on Intel's AVX512-BF16 without AMX, where the bf16 step was 1.7x slower, or
    # missing AMD's, where it was 0.61x of fp32 (bench section b)
    from mmkit.hardware import resolve_precision

    assert resolve_precision("auto", "cpu", {"amx_bf16", "amx_tile", "avx512f"}, "GenuineIntel") == "bf16"
    assert resolve_precision("auto", "cpu", {"avx512_bf16", "avx512f"}, "GenuineIntel") == "fp32"
    assert resolve_precision("auto", "cpu", {"avx512_bf16", "avx512f"}, "AuthenticAMD") == "bf16"
    assert resolve_precision("auto", "cpu", {"avx512f", "avx2"}, "AuthenticAMD") == "fp32"
    assert resolve_precision("auto", "cpu", set(), "") == "fp32"
    assert resolve_precision("fp16", "cpu", {"amx_bf16"}, "GenuineIntel") == "fp16"

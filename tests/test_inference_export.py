"""The inference export: a directory transformers' LlamaForCausalLM loads with no code of ours,
giving the logits mmkit's model gives on the same fp16-rounded weights, head tied, half the bytes."""

import json
import os

import pytest

if os.environ.get("CI"):  # in CI a missing test dependency is a failure, not a skip
    import transformers
else:
    transformers = pytest.importorskip("transformers")
import torch  # noqa: E402
import yaml  # noqa: E402

from conftest import REPO as ROOT, run_script  # noqa: E402
from mmkit.checkpoint.files import cast_state_dict  # noqa: E402
from mmkit.config import load_config, model_config  # noqa: E402
from mmkit.model import MiniMindForCausalLM  # noqa: E402

TINY = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 300}
# fp32 arithmetic on identical weights: measured 0 (sdpa) and 5e-7 (eager attention); a wrong
# rope_theta (1e4) moves the logits by 3e-3, a wrong rms_norm_eps (1e-6) by 9e-3
TOL = 1e-5


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """A seeded tiny model saved as a straight-like weights file, exported by the script."""
    tmp = tmp_path_factory.mktemp("export")
    cfg = yaml.safe_load((ROOT / "config.yaml").read_text())
    cfg.update(outdir=str(tmp), model={**cfg["model"], **TINY})
    config = tmp / "config.yaml"
    config.write_text(yaml.safe_dump(cfg))
    run_cfg = load_config(config)
    torch.manual_seed(0)
    model = MiniMindForCausalLM(model_config(run_cfg))
    # training moves the norms off 1: make them random too, so a wrong eps or a missing norm would show
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("layernorm.weight") or name == "model.norm.weight":
                p.uniform_(0.5, 1.5)
    weights = tmp / "straight.pth"
    torch.save(model.state_dict(), weights)
    outdir = tmp / "inference"
    proc = run_script("export_inference.py", "--config", config, "--weights", weights, "--outdir", outdir, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    return {"cfg": model_config(run_cfg), "weights": weights, "outdir": outdir}


@pytest.fixture(scope="module")
def hf_load(exported):
    # dtype= is transformers 5's name for torch_dtype
    return transformers.LlamaForCausalLM.from_pretrained(
        exported["outdir"], dtype=torch.float32, output_loading_info=True
    )


@pytest.fixture(scope="module")
def hf_model(hf_load):
    return hf_load[0].eval()


def test_export_writes_config_and_safetensors_only(exported):
    assert sorted(p.name for p in exported["outdir"].iterdir()) == ["config.json", "model.safetensors"]
    conf = json.loads((exported["outdir"] / "config.json").read_text())
    assert conf["architectures"] == ["LlamaForCausalLM"] and conf["model_type"] == "llama"
    assert conf["intermediate_size"] == exported["cfg"].intermediate_size
    assert conf["tie_word_embeddings"] is True


def test_safetensors_holds_fp16_embedding_without_lm_head(exported):
    from safetensors import safe_open

    with safe_open(exported["outdir"] / "model.safetensors", "pt") as f:
        keys = set(f.keys())
        assert "lm_head.weight" not in keys and "model.embed_tokens.weight" in keys
        assert {f.get_tensor(k).dtype for k in keys} == {torch.float16}


def test_transformers_logits_match_mmkit_on_same_fp16_weights(exported, hf_model):
    cfg = exported["cfg"]
    sd = torch.load(exported["weights"], weights_only=True)
    ours = MiniMindForCausalLM(cfg)
    ours.load_state_dict(cast_state_dict(sd, torch.float16))  # rounded to fp16, computed in fp32
    ours.eval()
    idx = torch.randint(0, cfg.vocab_size, (2, 24), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want, _ = ours(idx)
        got = hf_model(input_ids=idx).logits
    diff = (got - want).abs().max().item()
    print(f"max |logit diff| transformers vs mmkit: {diff:.3g}")
    assert got.shape == want.shape
    assert diff < TOL


def test_transformers_finds_every_weight_in_the_file(hf_load):
    info = hf_load[1]
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info


def test_transformers_reties_lm_head_to_embedding(hf_model):
    assert hf_model.config.tie_word_embeddings
    head, embed = hf_model.lm_head.weight, hf_model.model.embed_tokens.weight
    assert head.data_ptr() == embed.data_ptr()
    assert torch.count_nonzero(embed) > 0  # loaded, not left at zero or init


def test_safetensors_is_about_half_the_fp32_weights_file(exported):
    ratio = (exported["outdir"] / "model.safetensors").stat().st_size / exported["weights"].stat().st_size
    assert 0.45 < ratio < 0.55, ratio


def test_export_refuses_weights_whose_head_is_not_tied(exported, tmp_path):
    sd = torch.load(exported["weights"], weights_only=True)
    sd["lm_head.weight"] = sd["lm_head.weight"].clone() + 1  # untied: tie_word_embeddings would lie
    untied = tmp_path / "untied.pth"
    torch.save(sd, untied)
    config = exported["outdir"].parent / "config.yaml"
    r = run_script("export_inference.py", "--config", config, "--weights", untied, "--outdir", tmp_path / "out",
                   cwd=ROOT)
    assert r.returncode == 2 and "not tied" in r.stderr
    assert not (tmp_path / "out" / "model.safetensors").exists()

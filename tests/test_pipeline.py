"""The experiment's claims, checked on the artifacts of one tiny end-to-end snakemake run."""

import csv
import re
import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from conftest import TINY, assert_same_state_dict, run_script, same_state_dict

from mmkit.checkpoint.files import cast_state_dict
from mmkit.config import load_config, model_config
from mmkit.model import MiniMindForCausalLM


def load(path):
    return torch.load(path, map_location="cpu", weights_only=True)


assert_identical = assert_same_state_dict


def test_resumed_equals_straight_bit_for_bit(pipeline):
    straight, resumed = load(pipeline / "straight.pth"), load(pipeline / "resumed.pth")
    assert len(straight) == 3 + 9 * TINY["model"]["num_hidden_layers"]  # every tensor is compared
    assert_identical(straight, resumed)


def test_resumed_log_equals_straight_log_tail_line_for_line(pipeline):
    straight = (pipeline / "straight_log.csv").read_text().splitlines()
    resumed = (pipeline / "resumed_log.csv").read_text().splitlines()
    assert straight[0] == resumed[0] == "step,train_loss"
    assert len(straight) == 1 + TINY["steps"]
    assert resumed[1:] == straight[1 + TINY["stop_at"]:]


def test_loss_logs_have_six_decimals(pipeline):
    for row in csv.DictReader(open(pipeline / "straight_log.csv")):
        assert len(row["train_loss"].split(".")[1]) == 6


def test_first_loss_is_near_log_vocab(pipeline):
    first = float((pipeline / "straight_log.csv").read_text().splitlines()[1].split(",")[1])
    assert abs(first - np.log(TINY["model"]["vocab_size"])) < 0.5


def test_dropping_optimizer_state_changes_the_result(pipeline):
    straight, noopt = load(pipeline / "straight.pth"), load(pipeline / "noopt.pth")
    assert not same_state_dict(straight, noopt)
    proc = run_script("compare.py", pipeline / "straight.pth", pipeline / "noopt.pth", "--quiet")
    assert proc.returncode == 1 and "tensors differ" in proc.stdout


def test_rewinding_the_data_position_changes_the_result(pipeline):
    straight, noskip = load(pipeline / "straight.pth"), load(pipeline / "noskip.pth")
    assert not same_state_dict(straight, noskip)
    # the first step after the cut trains on step 1's batch again, so its loss differs from straight's
    step = str(TINY["stop_at"] + 1)
    loss = {r["step"]: r["train_loss"] for r in csv.DictReader(open(pipeline / "noskip_log.csv"))}
    ref = {r["step"]: r["train_loss"] for r in csv.DictReader(open(pipeline / "straight_log.csv"))}
    assert loss[step] != ref[step]


def test_compare_script_says_identical_for_resumed(pipeline):
    proc = run_script("compare.py", pipeline / "straight.pth", pipeline / "resumed.pth")
    assert proc.returncode == 0, proc.stdout
    assert "0 of" in proc.stdout.splitlines()[-1]


def test_no_tmp_file_is_left_behind(pipeline):
    assert not list(pipeline.rglob("*.tmp"))


def test_resume_file_holds_weights_optimizer_step_and_generator(pipeline):
    state = load(pipeline / "resume.pth")  # weights_only=True loads it: plain tensors and data only
    assert {"model", "optimizer", "step", "gen_state", "fingerprint"} <= state.keys()
    assert state["step"] == TINY["stop_at"]
    assert state["gen_state"].dtype == torch.uint8
    moments = state["optimizer"]["state"][0]
    assert {"exp_avg", "exp_avg_sq", "step"} <= moments.keys()
    assert state["fingerprint"]["threads"] == load_config(pipeline / "settings" / "resume.yaml").threads
    # the tie survives the round trip: one tensor under two names
    assert state["model"]["lm_head.weight"].data_ptr() == state["model"]["model.embed_tokens.weight"].data_ptr()


def test_fp16_file_is_nearly_half_and_keeps_the_tie(pipeline):
    result = json.loads((pipeline / "fp16.json").read_text())
    assert result["fp32_bytes"] == os.path.getsize(pipeline / "straight.pth")
    assert result["fp16_bytes"] == os.path.getsize(pipeline / "straight_fp16.pth")
    assert 0.45 < result["fp16_bytes"] / result["fp32_bytes"] < 0.56
    half = load(pipeline / "straight_fp16.pth")
    assert all(t.dtype == torch.float16 for t in half.values())
    assert half["lm_head.weight"].data_ptr() == half["model.embed_tokens.weight"].data_ptr()


def test_fp16_logit_diff_is_recomputed_exactly_and_small(pipeline):
    cfg = load_config(pipeline / "settings" / "fp16.yaml")
    result = json.loads((pipeline / "fp16.json").read_text())
    tokens = torch.from_numpy(np.load(pipeline / "data" / "val.npy")[: cfg.seq_len].astype(np.int64))[None]
    straight = load(pipeline / "straight.pth")
    logits = []
    for sd in (straight, cast_state_dict(straight, torch.float16)):
        model = MiniMindForCausalLM(model_config(cfg)).eval()
        model.load_state_dict(sd)
        with torch.no_grad():
            logits.append(model(tokens)[0])
    diff = (logits[0] - logits[1]).abs().max().item()
    assert result["max_logit_diff"] == diff
    assert 0 < diff < 0.05


def test_optim_counts_match_the_resume_file_and_ratio_is_two(pipeline):
    result = json.loads((pipeline / "optim.json").read_text())
    state = load(pipeline / "resume.pth")
    params = MiniMindForCausalLM(model_config(load_config(pipeline / "settings" / "resume.yaml"))).num_parameters()
    assert result["model_numel"] == params
    moments = sum(t.numel() for s in state["optimizer"]["state"].values() for t in s.values() if t.dim() >= 1)
    assert result["optimizer_numel"] == moments
    assert result["ratio"] == 2.0  # AdamW: exp_avg and exp_avg_sq, one element each per weight
    # the table of entries the docs show: every entry of this very file, in its order, none invented, and
    # its tensor elements counted as the file stores them (the tied head once; AdamW's 0-dim counters not).
    # Catches a resume entry the generated table leaves out, and the tie counted twice.
    rows = [line.split(" | ") for line in (pipeline / "resume_entries.md").read_text().splitlines()
            if line.startswith("| `")]
    assert [r[0].removeprefix("| ").strip("`") for r in rows] == [k for k in state if k != "digests"]
    counts = {r[0].removeprefix("| ").strip("`"): r[1] for r in rows}
    assert counts["model"] == f"{params:,}"
    assert counts["optimizer"] == f"{moments:,}"
    assert counts["step"] == "—" and all(r[3] for r in rows)  # a number holds no tensor; each row says what it is


def test_divergence_table_reads_zero_for_resumed_and_not_for_ablations(pipeline):
    rows = {r["variant"]: r for r in csv.DictReader(open(pipeline / "divergence.csv"))}
    gaps = ("max_abs_dweight", "rel_l2_dweight", "tensors_differing", "val_loss_gap",
            "mean_abs_loss_gap", "max_abs_loss_gap")
    assert all(float(rows["resumed"][c]) == 0 for c in gaps)
    for name in ("noopt", "noskip"):
        assert float(rows[name]["max_abs_dweight"]) > 0
        assert float(rows[name]["max_abs_loss_gap"]) > 0
    # the weight gap in the table is the one a direct comparison gives
    straight, noopt = load(pipeline / "straight.pth"), load(pipeline / "noopt.pth")
    direct = max((straight[k] - noopt[k]).abs().max().item() for k in straight)
    assert float(rows["noopt"]["max_abs_dweight"]) == direct


def test_report_has_the_three_sections_and_generated_numbers(pipeline):
    report = (pipeline / "report.md").read_text()
    headings = [line for line in report.splitlines() if line.startswith("## ")]
    assert headings[:3] == ["## 무엇을 저장하나", "## 빠뜨리면", "## 반정밀도"]
    optim = json.loads((pipeline / "optim.json").read_text())
    fp16 = json.loads((pipeline / "fp16.json").read_text())
    assert f"**{optim['ratio']:.2f}**" in report
    assert f"**{fp16['fp16_bytes']:,}**" in report
    saving, missing, half = report.split("## ")[1:4]
    assert f"{optim['ratio']:.2f}" in saving and f"{fp16['fp16_bytes']:,}" in half
    assert "noopt" in missing and "noskip" in missing
    assert "resume.pth" in half and "straight_fp16.pth" in half
    # what the resume file holds, generated: every entry of this very file is named, so the list cannot go
    # stale as the hand-written one did (catches a report that lists entries of its own again)
    state = load(pipeline / "resume.pth")
    assert all(f"| `{k}` |" in saving for k in state if k != "digests")


def test_settings_files_hold_the_merged_overlay(pipeline):
    resolved = yaml.safe_load((pipeline / "settings" / "resume.yaml").read_text())
    assert resolved["steps"] == TINY["steps"]
    # and config.yaml's model keys the overlay leaves alone
    assert resolved["model"] == {**TINY["model"], "arch": "minimind2", "dropout": 0.0, "flash_attn": True}
    assert resolved["seed"] == 7 and resolved["lr"] == 3e-3  # untouched keys come from config.yaml
    assert resolved["stop_at"] == TINY["stop_at"]
    assert "stop_at" not in yaml.safe_load((pipeline / "settings" / "straight.yaml").read_text())


def test_summary_table_is_what_the_readme_block_is_filled_with(pipeline, tmp_path):
    from conftest import REPO, run_script

    # as make readme calls it: README.md and docs/*.md, the block found in the one file that holds it
    readme = tmp_path / "README.md"
    readme.write_text((REPO / "README.md").read_text())
    docs = {tmp_path / p.name: p.read_bytes() for p in (REPO / "docs").glob("*.md")}
    for path, text in docs.items():
        path.write_bytes(text)
    proc = run_script("update_readme.py", readme, *docs, f"results={pipeline / 'summary.md'}")
    assert proc.returncode == 0, proc.stderr
    assert {path: path.read_bytes() for path in docs} == docs
    block = readme.read_text().split("<!-- results:start -->\n")[1].split("<!-- results:end -->")[0]
    assert block == (pipeline / "summary.md").read_text()
    fp16 = json.loads((pipeline / "fp16.json").read_text())
    assert f"| {fp16['fp16_bytes']:,} |" in block
    # the rest of the README is untouched
    assert readme.read_text().replace(block, "") == (REPO / "README.md").read_text().replace(
        (REPO / "README.md").read_text().split("<!-- results:start -->\n")[1].split("<!-- results:end -->")[0], "")


ABLATIONS = ["noopt", "noskip", "nosched", "halfresume"]


def test_every_divergence_value_is_what_the_artifacts_give(pipeline):
    from conftest import TINY

    from mmkit.data import load_tokens
    from mmkit.report import read_loss_log
    from mmkit.train import eval_loss

    cfg = load_config(pipeline / "settings" / "divergence.yaml")
    val = load_tokens(pipeline / "data" / "val.npy", cfg.model.vocab_size, cfg.seq_len + 1)
    rows = {r["variant"]: r for r in csv.DictReader(open(pipeline / "divergence.csv"))}
    assert list(rows) == ["straight", "resumed", *ABLATIONS]
    straight, straight_log = load(pipeline / "straight.pth"), read_loss_log(pipeline / "straight_log.csv")
    model = MiniMindForCausalLM(model_config(cfg))
    for name in ["resumed", *ABLATIONS]:
        sd, log = load(pipeline / f"{name}.pth"), read_loss_log(pipeline / f"{name}_log.csv")
        names = [k for k in sd if k != "lm_head.weight"]
        dw = torch.cat([(sd[k] - straight[k]).flatten().double() for k in names])
        w = torch.cat([straight[k].flatten().double() for k in names])
        gaps = [abs(log[s] - straight_log[s]) for s in range(TINY["stop_at"] + 1, TINY["steps"] + 1)]
        model.load_state_dict(sd)
        row = {k: float(v) for k, v in rows[name].items() if k != "variant"}
        assert row["max_abs_dweight"] == dw.abs().max().item()
        assert row["rel_l2_dweight"] == pytest.approx((dw.norm() / w.norm()).item(), rel=1e-9)
        assert row["tensors_differing"] == sum(not torch.equal(sd[k], straight[k]) for k in names)
        assert row["final_train_loss"] == log[TINY["steps"]]
        assert row["val_loss"] == pytest.approx(eval_loss(model, val, cfg.seq_len), rel=1e-12)
        assert row["mean_abs_loss_gap"] == pytest.approx(sum(gaps) / len(gaps), rel=1e-12)
        assert row["max_abs_loss_gap"] == max(gaps)


@pytest.mark.parametrize("name", ABLATIONS)
def test_every_ablation_silently_changes_the_result(pipeline, name):
    straight, variant = load(pipeline / "straight.pth"), load(pipeline / f"{name}.pth")
    assert not same_state_dict(straight, variant)


def test_nosched_starts_the_resumed_steps_at_the_peak_learning_rate(pipeline):
    from conftest import TINY

    from mmkit.train import lr_at

    log = (pipeline / "logs" / "nosched.log").read_text()
    first = next(line for line in log.splitlines() if line.startswith(f"step {TINY['stop_at'] + 1:>4}"))
    assert f"lr {lr_at(1, TINY['steps'], 3e-3):.3e}" in first
    resumed = (pipeline / "logs" / "resumed.log").read_text()
    assert f"lr {lr_at(TINY['stop_at'] + 1, TINY['steps'], 3e-3):.3e}" in resumed


def test_halfresume_resumes_from_fp16_weights_and_drifts_least(pipeline):
    state = load(pipeline / "resume_fp16.pth")
    assert all(t.dtype == torch.float16 for t in state["model"].values())
    assert state["optimizer"]["state"][0]["exp_avg"].dtype == torch.float32  # only the weights were halved
    rows = {r["variant"]: float(r["rel_l2_dweight"]) for r in csv.DictReader(open(pipeline / "divergence.csv"))}
    assert 0 < rows["halfresume"] < min(rows[n] for n in ("noopt", "noskip", "nosched"))


def test_bf16_beside_fp16_sizes_and_logit_change(pipeline):
    bf16, fp16 = (json.loads((pipeline / f"{d}.json").read_text()) for d in ("bf16", "fp16"))
    assert bf16["bf16_bytes"] == os.path.getsize(pipeline / "straight_bf16.pth")
    assert bf16["fp32_bytes"] == fp16["fp32_bytes"]
    assert all(t.dtype == torch.bfloat16 for t in load(pipeline / "straight_bf16.pth").values())
    assert bf16["max_logit_diff"] > 0


def test_plots_are_pngs_linked_from_the_report(pipeline):
    report = (pipeline / "report.md").read_text()
    for png in ("plots/loss.png", "plots/loss_gap.png"):
        assert (pipeline / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f"]({png})" in report


def test_report_environment_and_wall_time_come_from_the_artifacts(pipeline):
    report = (pipeline / "report.md").read_text()
    fingerprint = load(pipeline / "resume.pth")["fingerprint"]
    assert f"torch {fingerprint['torch']}" in report and f"스레드 {fingerprint['threads']}" in report
    seconds = sum(json.loads(f.read_text())["train_seconds"] for f in (pipeline / "timing").glob("*.json"))
    assert f"{seconds:.1f}초" in report
    for name in ABLATIONS:
        assert f"| {name} |" in report and f"- **{name}**" in report
    assert "inference/model.safetensors" in report.split("## 반정밀도")[1]


def test_snakemake_html_report_holds_the_registered_artifacts(pipeline):
    from conftest import snakemake

    snakemake(pipeline.parent, "--report", "results/report.html")
    html = (pipeline / "report.html").read_text(errors="ignore")
    for name in ("loss.png", "loss_gap.png", "divergence.csv", "report.md"):
        assert name in html


# --- every number of summary.md and report.md, recomputed here from the .pth files, logs and tokens ----


@pytest.fixture(scope="module")
def truths(pipeline) -> dict:
    """Each run's numbers computed in this test from the artifacts' sources, not by mmkit's report code."""
    import numpy as np
    import torch.nn.functional as F

    arch = model_config(load_config(pipeline / "settings" / "divergence.yaml"))
    seq_len = TINY["seq_len"]
    val = np.load(pipeline / "data" / "val.npy").astype(np.int64)
    n = (len(val) - 1) // seq_len
    x = torch.from_numpy(val[: n * seq_len]).view(n, seq_len)
    y = torch.from_numpy(val[1 : n * seq_len + 1]).view(n, seq_len)
    model = MiniMindForCausalLM(arch).eval()

    def val_loss(sd):
        model.load_state_dict(sd)
        with torch.no_grad():
            logits = model(x)[0]
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).double(), y.reshape(-1)).item()

    def log(name):
        rows = list(csv.DictReader(open(pipeline / f"{name}_log.csv")))
        return {int(r["step"]): float(r["train_loss"]) for r in rows}

    straight, straight_log = load(pipeline / "straight.pth"), log("straight")
    names = [k for k in straight if k != "lm_head.weight"]
    out = {"straight": {"val_loss": val_loss(straight), "final": straight_log[TINY["steps"]]}}
    for name in ["resumed", *ABLATIONS]:
        sd, variant_log = load(pipeline / f"{name}.pth"), log(name)
        dw = torch.cat([(sd[k].double() - straight[k].double()).flatten() for k in names])
        w = torch.cat([straight[k].double().flatten() for k in names])
        gaps = [abs(variant_log[s] - straight_log[s]) for s in range(TINY["stop_at"] + 1, TINY["steps"] + 1)]
        out[name] = {"max_abs": dw.abs().max().item(), "rel_l2": (dw.norm() / w.norm()).item(),
                     "mean_gap": sum(gaps) / len(gaps), "max_gap": max(gaps), "val_loss": val_loss(sd),
                     "final": variant_log[TINY["steps"]],
                     "differing": sum(not same_state_dict({0: sd[k]}, {0: straight[k]}) for k in names)}
    resume = load(pipeline / "resume.pth")
    weights = sum(straight[k].numel() for k in names)
    moments = sum(t.numel() for s in resume["optimizer"]["state"].values() for t in s.values() if t.dim() >= 1)
    half = {k: t.half() for k, t in straight.items()}
    logits = []
    for sd in (straight, half):
        model.load_state_dict(sd)
        with torch.no_grad():
            logits.append(model(x[:1])[0][0])
    out["files"] = {"params": weights, "ratio": moments / weights,
                    "straight_bytes": (pipeline / "straight.pth").stat().st_size,
                    "fp16_bytes": (pipeline / "straight_fp16.pth").stat().st_size,
                    "resume_bytes": (pipeline / "resume.pth").stat().st_size,
                    "max_logit": (logits[0] - logits[1]).abs().max().item()}
    return out


def shown(text: str, value: float) -> bool:
    """Does a number printed to 3-4 significant digits (or '0' for exactly zero) show VALUE?"""
    text = text.strip().replace(",", "")
    if value == 0:
        return text == "0"
    return float(text) == pytest.approx(value, rel=5e-3)


def isa_flags() -> str:
    """The machine's bf16-relevant ISA flags, read here from /proc/cpuinfo, not through mmkit.hardware."""
    flags = next((line.split(":", 1)[1].split() for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("flags")), [])
    return ", ".join(f"{f} {'yes' if f in flags else 'no'}" for f in ("amx_bf16", "avx512_bf16", "avx512f"))


def table_row(text: str, first_cell: str) -> list[str]:
    line = next(line for line in text.splitlines() if line.startswith(f"| {first_cell} |"))
    return [c.strip() for c in re.split(r"(?<!\\)\|", line.strip().strip("|"))]  # \| inside a cell stays


def test_every_number_in_the_summary_is_recomputed_from_the_artifacts(pipeline, truths):
    text = (pipeline / "summary.md").read_text()
    files = truths["files"]
    assert text.splitlines()[0] == (
        f"Default run: {files['params']:,} parameters, {TINY['steps']} steps, cut at {TINY['stop_at']}, "
        f"torch {torch.__version__} on cpu, 1 thread(s), fp32, AdamW fused. CPU flags: {isa_flags()}.")
    assert shown(table_row(text, "straight")[5], truths["straight"]["val_loss"])
    for name in ["resumed", *ABLATIONS]:
        t, cells = truths[name], table_row(text, name)
        mean, worst = cells[4].split(" / ")
        for cell, value in ((cells[2], t["max_abs"]), (cells[3], t["rel_l2"]), (mean, t["mean_gap"]),
                            (worst, t["max_gap"]), (cells[5], t["val_loss"])):
            assert shown(cell, value), (name, cell, value)
    assert shown(table_row(text, "straight.pth (fp32 weights)")[1], files["straight_bytes"])
    fp16 = table_row(text, "straight_fp16.pth")
    assert shown(fp16[1], files["fp16_bytes"])
    ratio, logit = fp16[2].split(" × fp32; max \\|Δlogit\\| ")
    assert shown(ratio, files["fp16_bytes"] / files["straight_bytes"]) and shown(logit, files["max_logit"])
    resume = table_row(text, "resume.pth (weights + AdamW + step + generator)")
    assert shown(resume[1], files["resume_bytes"])
    assert shown(resume[2].removeprefix("optimizer/weights elements = "), files["ratio"])


def test_every_number_in_the_reports_table_is_recomputed_from_the_artifacts(pipeline, truths):
    text = (pipeline / "report.md").read_text()
    for name in ["straight", "resumed", *ABLATIONS]:
        t, cells = truths[name], table_row(text, name)
        zero = name == "straight"
        val, gap = cells[6].split(" (")
        mean, worst = cells[7].split(" / ")
        assert shown(val, t["val_loss"]) and shown(cells[5], t["final"])
        # the gap to 2 significant digits; abs: the two val losses here are summed in another order
        assert float(gap.rstrip(")")) == pytest.approx(t["val_loss"] - truths["straight"]["val_loss"], rel=0.05,
                                                       abs=1e-5)
        for cell, key in ((cells[2], "max_abs"), (cells[3], "rel_l2"), (cells[4], "differing"), (mean, "mean_gap"),
                          (worst, "max_gap")):
            assert shown(cell, 0 if zero else t[key]), (name, cell)
    fp16 = table_row(text, "fp16")
    files = truths["files"]
    assert shown(fp16[2], files["fp16_bytes"]) and shown(fp16[4], files["max_logit"])
    assert f"재개 파일({files['resume_bytes']:,} 바이트)" in text


def test_targets_are_the_inputs_shifted_by_one(pipeline):
    from mmkit.data import get_batch

    tokens = np.load(pipeline / "data" / "train.npy")
    x, y = get_batch(tokens, 4, TINY["seq_len"], torch.Generator().manual_seed(3))
    starts = torch.randint(0, len(tokens) - TINY["seq_len"] - 1, (4,), generator=torch.Generator().manual_seed(3))
    for row, i in enumerate(starts.tolist()):
        assert x[row].tolist() == tokens[i : i + TINY["seq_len"]].tolist()
        assert y[row].tolist() == tokens[i + 1 : i + 1 + TINY["seq_len"]].tolist()

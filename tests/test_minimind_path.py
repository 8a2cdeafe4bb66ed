"""Training as MiniMind users do: MiniMind-3's architecture, PretrainDataset JSONL in epoch order through a
DataLoader with workers, gradient accumulation with MiniMind's trailing step, dropout, fp16 with a
GradScaler; each resumed in a new process and compared tensor by tensor with the straight run.
"""

import json
import math
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
import yaml
from conftest import assert_same_state_dict, differences, run_script, tiny_config

# the tiny pipeline's JSONL holds 70 documents: 18 batches of 4 per epoch, the last one of 2 documents;
# with accumulation 4 an epoch is 5 optimizer steps, the fifth a trailing step of 2 batches. 12 steps span
# 3 epochs; the cut at 7 falls in the middle of the second.
PARITY = {"accumulation_steps": 4, "precision": "fp16", "stop_at": 7,
          "model": {"arch": "minimind3", "dropout": 0.1}, "data": {"format": "minimind", "workers": 2}}


def write_config(path, **overrides):
    cfg = tiny_config(**overrides)
    path.write_text(yaml.safe_dump(cfg))
    return path


def run(pipeline, config, out, *args):
    data = ("--jsonl", pipeline / "data" / "train.jsonl", "--tokenizer", pipeline / "data" / "tokenizer.json")
    return run_script("run.py", "--config", config, *data, "--out", out, *args)


def train(pipeline, config, out, *args):
    proc = run(pipeline, config, out, *args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def finished(runs, *names) -> dict:
    """The stderr of each named run of parity_runs, once the test has asserted that each one finished."""
    made = runs.made(names)
    for name in names:
        assert made[name].returncode == 0, f"{name}: {made[name].stderr[-3000:]}"
    return {name: made[name].stderr for name in names}


def weights(path):
    return torch.load(path, weights_only=True)


class ParityRuns:
    """Straight and stopped with 2 workers; then resumed from the one resume file in new processes: with 2
    workers, with 0, and with the RNG state or the epoch position left out. Each run is made the first time a
    test asks for it (under make mutants a breakage's test may need only some), two at a time."""

    def __init__(self, pipeline, tmp):
        self.pipeline, self.tmp, self.runs = pipeline, tmp, {}
        two = write_config(tmp / "two.yaml", **PARITY)
        zero = write_config(tmp / "zero.yaml", **{**PARITY, "data": {"format": "minimind", "workers": 0}})
        self.todo = {"straight": (two, ("--loss-log", tmp / "straight.csv")), "resume": (two, ("--stop-at",))}
        resumes = {"resumed": (two, ()), "resumed_w0": (zero, ()), "norng": (two, ("--no-rng",)),
                   "replay": (two, ("--replay",))}
        self.todo |= {name: (cfg, ("--resume", tmp / "resume.pth", "--loss-log", tmp / f"{name}.csv", *flags))
                      for name, (cfg, flags) in resumes.items()}

    def made(self, names) -> dict:
        resumed = set(names) - {"straight", "resume"}
        first = set(names) & {"straight", "resume"} | ({"resume"} if resumed else set())
        for batch in (first, resumed):  # the resumed runs read the stopped run's file
            with ThreadPoolExecutor(2) as pool:
                started = {name: pool.submit(run, self.pipeline, self.todo[name][0], self.tmp / f"{name}.pth",
                                             *self.todo[name][1]) for name in sorted(batch - self.runs.keys())}
                self.runs |= {name: f.result() for name, f in started.items()}
        return self.runs


@pytest.fixture(scope="module")
def parity_runs(pipeline, tmp_path_factory):
    """(the runs' folder, ParityRuns). Each test asserts that the runs it reads finished (finished()): a run
    refused here is a failed assertion of the test, not a fixture error."""
    tmp = tmp_path_factory.mktemp("parity")
    return tmp, ParityRuns(pipeline, tmp)


@pytest.mark.slow
def test_resumed_equals_straight_with_2_and_with_0_workers(parity_runs):
    """Catches: a data position, RNG, GradScaler or accumulation window that a resume does not restore, or
    a DataLoader whose worker count changes what a step reads."""
    tmp, runs = parity_runs
    finished(runs, "straight", "resume", "resumed", "resumed_w0")
    straight = weights(tmp / "straight.pth")
    for name in ("resumed", "resumed_w0"):
        assert_same_state_dict(weights(tmp / f"{name}.pth"), straight)
        assert (tmp / f"{name}.csv").read_text().splitlines()[1:] == \
            (tmp / "straight.csv").read_text().splitlines()[1 + PARITY["stop_at"]:]
    state = weights(tmp / "resume.pth")
    assert state["data_position"] == {"epoch": 1, "batch": 8}  # steps 6, 7: two windows of 4 into epoch 1
    assert state["scaler"]["scale"] > 0 and state["fingerprint"]["data_format"] == "minimind"


def test_leaving_out_the_rng_or_the_epoch_position_changes_the_weights(parity_runs):
    """Catches: an RNG state or data position that does not matter (then the resume entries are untested)."""
    tmp, runs = parity_runs
    logs = finished(runs, "straight", "resume", "norng", "replay")
    straight = weights(tmp / "straight.pth")
    for name in ("norng", "replay"):
        assert differences(weights(tmp / f"{name}.pth"), straight), name
    assert "resume: ignoring entry 'rng_state'" in logs["norng"]
    assert "resume: ignoring entry 'data_position'" in logs["replay"]


def test_the_steps_follow_minimind_accumulation_and_trailing_step(parity_runs):
    """Catches: a trailing step that is not taken or an LR not set per micro-batch, checked against MiniMind's
    loop written out here: lr from epoch * iters + step over epochs * iters micro-batches."""
    tmp, runs = parity_runs
    logs = finished(runs, "straight")
    iters, accumulation, lr = 18, PARITY["accumulation_steps"], tiny_config()["lr"]
    updates = []  # MiniMind's loop: (micro-batch number) of the last micro-batch of each optimizer step
    for epoch in range(3):
        for step in range(1, iters + 1):
            if step % accumulation == 0 or step == iters:  # an update, or the epoch's trailing one
                updates.append(epoch * iters + step)
    total = updates[11]  # the run ends after 12 optimizer steps: its LR schedule spans their micro-batches
    lrs = [lr * (0.1 + 0.45 * (1 + math.cos(math.pi * m / total))) for m in updates[:12]]
    logged = [float(line.split("lr ")[1].split()[0]) for line in logs["straight"].splitlines()
              if line.startswith("step ")]
    assert len(logged) == 12
    assert logged == [float(f"{x:.3e}") for x in lrs[:12]]


@pytest.mark.quick
def test_minimind3_is_minimind_head_s_architecture(tmp_path):
    """Catches: a missing q/k norm, another MLP width or eps; and checks the export against transformers'
    Qwen3ForCausalLM, an implementation that is not ours (at d65ef2c MiniMind-3 matched it: max |Δlogit| 0)."""
    from mmkit.export import write_inference_dir
    from mmkit.model import MiniMindForCausalLM, ModelConfig
    from transformers import Qwen3ForCausalLM

    dims = dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=2, vocab_size=6400)
    torch.manual_seed(0)
    v3 = MiniMindForCausalLM(ModelConfig(**dims, arch="minimind3"))
    v2 = MiniMindForCausalLM(ModelConfig(**dims))
    sd3, sd2 = v3.state_dict(), v2.state_dict()
    assert sorted(k for k in sd3 if k not in sd2) == sorted(
        f"model.layers.{i}.self_attn.{n}_norm.weight" for i in range(4) for n in "qk")
    assert sd3["model.layers.0.mlp.up_proj.weight"].shape == (832, 256)  # 64 * ceil(256 * pi / 64)
    assert sum(sd3[k].shape != sd2[k].shape for k in sd2) == 12  # a MiniMind2 checkpoint does not load
    assert v3.model.norm.eps == 1e-6 and v3.model.layers[0].self_attn.q_norm.weight.shape == (32,)

    with torch.no_grad():  # norms away from 1, so that a norm in the wrong place shows
        for name, p in v3.named_parameters():
            if "norm" in name:
                p.normal_(1.0, 0.2)
    write_inference_dir(tmp_path / "hf", v3.config, v3.state_dict(), torch.float32)
    hf = Qwen3ForCausalLM.from_pretrained(tmp_path / "hf", attn_implementation="sdpa").eval()
    ids = torch.randint(0, 6400, (2, 64), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        gap = (v3.eval()(ids)[0] - hf(ids).logits).abs().max().item()
    print(f"\nminimind3 vs Qwen3ForCausalLM, fp32: max |Δlogit| {gap}")
    assert gap <= 1e-5


def test_a_sample_is_minimind_s_pretrain_sample(pipeline):
    """Catches: special tokens in the wrong place, padding that is trained on, a missing truncation."""
    from mmkit.data import PretrainDataset
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(pipeline / "data" / "tokenizer.json"))
    bos, eos, pad = (tok.token_to_id(t) for t in ("<|im_start|>", "<|im_end|>", "<|endoftext|>"))
    ds = PretrainDataset(pipeline / "data" / "train.jsonl", pipeline / "data" / "tokenizer.json", 33, 512)
    texts = [json.loads(line)["text"] for line in (pipeline / "data" / "train.jsonl").read_text().splitlines()]
    x, y = ds[0]
    ids = tok.encode(texts[0], add_special_tokens=False).ids
    assert len(ids) > 31  # long enough to be cut
    assert x.tolist() == [bos] + ids[:31] and y.tolist() == ids[:31] + [eos]
    short = PretrainDataset(pipeline / "data" / "train.jsonl", pipeline / "data" / "tokenizer.json", 4096, 512)
    shortest = min(range(len(texts)), key=lambda i: len(texts[i]))
    x, y = short[shortest]
    n = len(tok.encode(texts[shortest], add_special_tokens=False).ids)
    assert x[n + 2:].eq(pad).all() and y[n + 1:].eq(-100).all() and y[n] == eos  # the padding is not trained on


def test_a_windows_resume_file_is_refused_by_a_minimind_run(pipeline, tiny_run, tmp_path):
    config = write_config(tmp_path / "m.yaml", data={"format": "minimind", "workers": 0})
    data = ("--jsonl", pipeline / "data" / "train.jsonl", "--tokenizer", pipeline / "data" / "tokenizer.json")
    proc = run_script("run.py", "--config", config, *data, "--resume", tiny_run["resume"], "--out", tmp_path / "o.pth")
    assert proc.returncode == 2 and "data_format windows in the file, minimind now" in proc.stderr, proc.stderr
    assert not (tmp_path / "o.pth").exists()


@pytest.mark.parametrize("lines, words", [
    (['{"text": "a"}', "not json"], "line 2 is not JSON"),
    (['{"text": "a"}', '{"txt": "b"}'], 'line 2 has no "text" field'),
    (['{"text": 3}'], 'line 1: "text" is a int, not a string'),
    ([], "holds no documents"),
])
def test_a_bad_jsonl_is_one_line_naming_the_line(pipeline, tmp_path, lines, words):
    jsonl = tmp_path / "bad.jsonl"
    jsonl.write_text("".join(line + "\n" for line in lines))
    config = write_config(tmp_path / "m.yaml", data={"format": "minimind", "workers": 0})
    proc = run_script("run.py", "--config", config, "--jsonl", jsonl, "--tokenizer", pipeline / "data" / "tokenizer.json",
                      "--out", tmp_path / "o.pth")
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith(f"error: training JSONL {jsonl} {words}"), \
        proc.stderr


def test_a_tokenizer_that_does_not_fit_is_refused_by_name(pipeline, tmp_path):
    from mmkit.data import load_tokenizer
    from mmkit.errors import UserError

    spec = json.loads((pipeline / "data" / "tokenizer.json").read_text())
    spec["added_tokens"] = [t for t in spec["added_tokens"] if t["content"] != "<|im_end|>"]
    del spec["model"]["vocab"]["<|im_end|>"]
    (tmp_path / "t.json").write_text(json.dumps(spec))
    with pytest.raises(UserError, match=r"lacks MiniMind's special token\(s\) <\|im_end\|>"):
        load_tokenizer(tmp_path / "t.json", 512)
    with pytest.raises(UserError, match="has 512 tokens, more than model.vocab_size 300"):
        load_tokenizer(pipeline / "data" / "tokenizer.json", 300)


@pytest.mark.parametrize("overrides, key", [
    ({"accumulation_steps": 0}, "accumulation_steps"),
    ({"data": {"workers": -1}}, "data.workers"),
    ({"data": {"format": "minimind"}, "parallel": {"world_size": 2}}, "data.format"),
])
def test_the_config_refuses_what_cannot_work_naming_the_key(pipeline, tmp_path, overrides, key):
    config = write_config(tmp_path / "bad.yaml", **overrides)
    proc = run_script("run.py", "--config", config, "--tokens", pipeline / "data" / "train.npy",
                      "--out", tmp_path / "o.pth")
    assert proc.returncode == 2 and proc.stderr.startswith(f"error: config key '{key}'"), proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1

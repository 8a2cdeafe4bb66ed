"""certify on programs written as other people write them: a console script a package ships (TRL's `trl sft`,
run unmodified as its users run it) and a script that begins as most Hugging Face scripts begin (transformers
and datasets imported before torch). Neither is this project's code nor holds certificate code.

Each verdict is held to ground truth measured without certify: the same command run straight, and run again,
SIGKILLed (its process group, for real) once step K's checkpoint is completely written, then resumed from it;
the two final models are compared tensor by tensor. Exact must mean bit-identical weights, and the max |Δw|
certify reports must be the one measured. Everything is local (HF_HUB_OFFLINE): a tiny Llama and its tokenizer
built here, and a jsonl of a few lines.
"""

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time

import pytest
import torch
from certkit.runs import SITE  # the recorder's sitecustomize, in the installed package
from conftest import REPO, clean_env, differences
from safetensors.torch import load_file

CERTIFY = [sys.executable, "-m", "certkit"]  # the installed package (certify/), as `certify` runs it
WORDS = ("the a cat dog bird sat ran flew on under over mat log tree red blue green small big old new "
         "quickly slowly today again and then").split()


def env_for(home):
    """Offline, one thread, and a Hugging Face home of the test's own (its datasets cache, no accelerate
    config of the user's); the path has a folder named cache, as HF's default ~/.cache/huggingface does."""
    return {**clean_env(), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1", "HF_HOME": str(home / "cache" / "huggingface"),
            "TOKENIZERS_PARALLELISM": "false"}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny Llama (config, weights, a word-level tokenizer built with `tokenizers`) saved with save_pretrained,
    and a local text dataset: a folder holding train.jsonl, which datasets.load_dataset(folder) reads as the train
    split ("a dataset is a directory that contains some data files in generic formats", the split found from the
    file names: https://huggingface.co/docs/datasets/package_reference/loading_methods#datasets.load_dataset)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    root = tmp_path_factory.mktemp("tiny")
    draw = random.Random(0)
    lines = [" ".join(draw.choice(WORDS) for _ in range(draw.randint(40, 120))) for _ in range(64)]
    (root / "data").mkdir()
    (root / "data" / "train.jsonl").write_text("".join(json.dumps({"text": line}) + "\n" for line in lines))
    # https://huggingface.co/docs/tokenizers/quicktour and, for the wrapper,
    # https://huggingface.co/docs/transformers/en/fast_tokenizers (PreTrainedTokenizerFast(tokenizer_object=...))
    tokenizer = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.train_from_iterator(lines, trainers.WordLevelTrainer(special_tokens=["<unk>", "<pad>", "<s>", "</s>"]))
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="<unk>", pad_token="<pad>",
                                   bos_token="<s>", eos_token="</s>")
    config = LlamaConfig(vocab_size=len(fast), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         pad_token_id=fast.pad_token_id, bos_token_id=fast.bos_token_id,
                         eos_token_id=fast.eos_token_id)
    with torch.random.fork_rng():  # the test process's own RNG left as it was
        torch.manual_seed(0)
        LlamaForCausalLM(config).save_pretrained(root / "model")
    fast.save_pretrained(root / "model")
    return root


def certify(out, stop_after, command, resume, env):
    proc = subprocess.run([*CERTIFY, "--out", str(out), "--stop-after", str(stop_after), "--resume", resume, "--full",
                           "--", *map(str, command)], capture_output=True, text=True, env=env, timeout=600)
    verdict = json.loads((out / "verdict.json").read_text()) if (out / "verdict.json").exists() else None
    return proc, verdict


def in_background(function, *args):
    """FUNCTION(*ARGS) in a thread (certify, while the ground truth is measured beside it: two cores); .result()."""
    box = {}
    thread = threading.Thread(target=lambda: box.update(value=function(*args)))
    thread.start()

    class Waiting:
        @staticmethod
        def result():
            thread.join()
            return box["value"]

    return Waiting()


def ground_truth(command, resume, folder, checkpoint, done, weights, env):
    """Without certify: COMMAND run straight; run again in a session of its own and SIGKILLed (the whole group:
    launcher and trainer) as soon as DONE, the last file written, is whole in CHECKPOINT; that run resumed with
    RESUME. COMMAND and RESUME hold {run} (FOLDER/straight, FOLDER/resumed). Returns (the final WEIGHTS file of
    each, the killed process's exit code, what it had left when it died, each run's seconds)."""
    runs = {name: folder / name for name in ("straight", "resumed")}
    fill = lambda args, run: [str(a).replace("{run}", str(run)) for a in args]  # noqa: E731
    seconds, began = {}, time.monotonic()
    straight = subprocess.run(fill(command, runs["straight"]), env=env, capture_output=True, text=True, timeout=300)
    assert straight.returncode == 0, straight.stderr[-3000:]
    seconds["straight"], began = time.monotonic() - began, time.monotonic()
    killed = subprocess.Popen(fill(command, runs["resumed"]), env=env, start_new_session=True,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    marker = runs["resumed"] / checkpoint / done
    while not done_writing(marker) and killed.poll() is None and time.monotonic() - began < 300:
        time.sleep(0.005)
    if killed.poll() is None:
        os.killpg(killed.pid, signal.SIGKILL)
    code = killed.wait()
    left = sorted(p.name for p in runs["resumed"].iterdir())
    seconds["killed"], began = time.monotonic() - began, time.monotonic()
    resumed = subprocess.run(fill([*command, *resume], runs["resumed"]), env=env, capture_output=True, text=True,
                             timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    seconds["resumed"] = time.monotonic() - began
    return {name: run / weights for name, run in runs.items()}, code, left, seconds


def done_writing(marker) -> bool:
    """MARKER exists and is whole: a JSON file that parses, or any other file (written by a rename)."""
    if not marker.exists():
        return False
    if marker.suffix != ".json":
        return True
    try:
        json.loads(marker.read_text())
        return True
    except ValueError:
        return False


def compare(files) -> tuple[bool, float, list]:
    """(bit-identical, max |Δw| over every tensor, what differs) between the straight and the resumed weights."""
    straight, resumed = (load_file(files[name]) for name in ("straight", "resumed"))
    diffs = differences(straight, resumed)
    gap = max((float((straight[k].double() - resumed[k].double()).abs().max()) for k in straight
               if k in resumed and straight[k].shape == resumed[k].shape), default=float("nan"))
    return not diffs, gap, diffs


def judge(name, proc, verdict, truth, stop_after, last_step):
    """The verdict through certify's command line, against the ground truth; the measured facts printed."""
    files, code, left, seconds = truth
    identical, gap, diffs = compare(files)
    print(f"\n{name}: verdict {'exact' if verdict and verdict['exact'] else verdict and verdict['first']}, "
          f"certify's max |dw| {verdict and verdict['max_abs_dw']}; ground truth: bit-identical {identical}, "
          f"max |dw| {gap}, killed run exit {code}, left {left}, seconds {seconds}")
    assert verdict is not None, f"certify judged nothing (exit {proc.returncode}): {proc.stderr[-3000:]}"
    # it was recorded: every run has its steps (a recorder that never installed gives certify no step at all)
    assert verdict["steps"] == {"straight": {"0": [1, last_step]}, "stopped": {"0": [1, stop_after]},
                                "resumed": {"0": [stop_after + 1, last_step]}}, verdict["steps"]
    # the ground truth's kill was real and came after step K's checkpoint, before the run's end
    assert code == -signal.SIGKILL, f"the run was not killed mid-run (exit {code}); it left {left}"
    assert verdict["exact"] == identical and proc.returncode == (0 if identical else 1), (
        f"certify says {'exact' if verdict['exact'] else 'not exact'} (exit {proc.returncode}, first difference "
        f"{verdict['first']}), the weights say {'bit-identical' if identical else diffs[:5]}, max |dw| {gap}")
    assert verdict["max_abs_dw"] == pytest.approx(gap, rel=1e-6, abs=0)


@pytest.mark.slow
def test_trl_sft_run_as_its_users_run_it_gets_the_verdict_its_weights_give(tiny, tmp_path):
    """Catches: a recorder that misses a process a console script's launcher starts (trl sft runs its script
    under `accelerate launch`, in a child process), or one that installs only when torch is imported first
    (TRL, transformers and datasets look torch up before importing it); a verdict that the weights, measured
    without certify, contradict (exact must mean bit-identical weights and the reverse), or a max |Δw| that is
    not the one measured. TRL's SFTConfig trains with gradient checkpointing by default: its recomputation
    inside backward must not be taken for samples, nor derail the recording of the steps after it."""
    env = env_for(tmp_path)
    # https://huggingface.co/docs/trl/clis: `trl sft --model_name_or_path ... --dataset_name ...`, and any
    # SFTConfig / TrainingArguments field as an option (https://huggingface.co/docs/trl/sft_trainer#trl.SFTConfig);
    # checkpoints every --save_steps as checkpoint-N, resumed with --resume_from_checkpoint (scripts/sft.py passes
    # it to trainer.train: https://huggingface.co/docs/transformers/en/trainer#checkpoints). --use_cpu: without a
    # GPU SFTConfig's default bf16 asks for it. Everything else is TRL's default (gradient checkpointing included).
    command = ["trl", "sft", "--model_name_or_path", tiny / "model", "--dataset_name", tiny / "data",
               "--output_dir", "{run}", "--max_steps", "12", "--save_steps", "6", "--per_device_train_batch_size",
               "4", "--max_length", "128", "--learning_rate", "1e-3", "--seed", "0", "--use_cpu", "true",
               "--report_to", "none", "--logging_strategy", "no", "--disable_tqdm", "true"]
    resume = "--resume_from_checkpoint {run}/checkpoint-{step}"
    certified = in_background(certify, tmp_path / "certify", 6, command, resume, env)
    truth = ground_truth(command, resume.replace("{step}", "6").split(), tmp_path / "truth", "checkpoint-6",
                         "trainer_state.json", "model.safetensors", env_for(tmp_path / "truth"))
    proc, verdict = certified.result()
    judge("trl sft", proc, verdict, truth, 6, 12)


def test_a_script_that_imports_transformers_before_torch_is_recorded_and_judged_as_its_weights_say(tiny, tmp_path):
    """Catches: a recorder that installs only when torch is imported first (this script imports datasets and
    transformers at the top, as Hugging Face's scripts begin: both call importlib.util.find_spec("torch") before
    anything imports torch; certify then said the command made no optimizer step); a verdict that the weights,
    measured without certify, contradict (its own loop: a seeded shuffle per epoch, the batches of the epoch
    already trained on skipped, AdamW, a cosine schedule with warmup and the RNG states saved and restored)."""
    env = env_for(tmp_path)
    command = [sys.executable, REPO / "tests" / "programs" / "hf_clm_no_trainer.py", "--config_name", tiny / "model",
               "--tokenizer_name", tiny / "model", "--train_file", tiny / "data" / "train.jsonl",
               "--output_dir", "{run}", "--block_size", "128", "--max_train_steps", "24", "--checkpointing_steps", "3"]
    resume = "--resume_from_checkpoint {run}/step_{step}"
    certified = in_background(certify, tmp_path / "certify", 6, command, resume, env)
    truth = ground_truth(command, resume.replace("{step}", "6").split(), tmp_path / "truth", "step_6",
                         "training_state.pt", "model.safetensors", env_for(tmp_path / "truth"))
    proc, verdict = certified.result()
    judge("hf_clm_no_trainer", proc, verdict, truth, 6, 24)


def test_activation_checkpointing_leaves_every_later_steps_samples_recorded(tmp_path):
    """Catches: a recorder whose count of nested forwards leaks when a forward raises (activation checkpointing's
    recomputation in backward stops early by raising inside a module: torch then calls an always_call forward
    hook as hook(module, args, output), without the kwargs asked for by with_kwargs), after which no forward is
    taken as the model's input: every step after the first records no samples at all, a resumed run's first step
    records one, and certify calls a bit-exact resume not exact (trl sft above, whose SFTConfig checkpoints
    activations by default). The program feeds the same batch every step: every step's samples are step 1's."""
    env = {**clean_env(), "OMP_NUM_THREADS": "1", "PYTHONPATH": str(SITE),
           "CERTIFY_RECORD": str(tmp_path / "certificate")}
    proc = subprocess.run([sys.executable, REPO / "tests" / "programs" / "checkpointed_blocks.py"], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "certificate" / "rank0.jsonl").open()]
    assert [row["step"] for row in rows] == [1, 2, 3]
    assert [row["samples"] for row in rows] == [rows[0]["samples"]] * 3, [row["samples"] for row in rows]
    assert "Recorder" not in proc.stderr, proc.stderr[-3000:]  # nothing of the recorder's reaches its output

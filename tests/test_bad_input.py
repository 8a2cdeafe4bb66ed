"""Bad input: one clear line, a non-zero exit, no output written, and nothing of the user's damaged.

The cases of run.py's checks of a resume file and a token file call its own code in this process
(tests/in_process.py: the UserError whose text is the line); one case of each path runs as a real process,
for the exit status, the one last line, and the output neither written nor damaged.
"""

import pickle
import subprocess
import sys
import zipfile

import numpy as np
import pytest
import torch
import yaml
from conftest import clean_env, copy_workflow, run_script, tiny_config
from in_process import refusal, until_first_step


def assert_refused(proc, *words, out=None):
    assert proc.returncode == 2, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and proc.stderr.strip().endswith(errors[0]), proc.stderr
    for w in words:
        assert w in errors[0], errors[0]
    if out is not None:
        assert not out.exists() and not out.with_name(out.name + ".tmp").exists()


def said(error: str, *words) -> None:
    for w in words:
        assert w in error, error


def resume_refusal(small_run, resume, *extra) -> str:
    """The line run.py refuses RESUME with, from its code in this process."""
    return refusal("--config", small_run["config"], "--tokens", small_run["tokens"], "--resume", resume,
                   "--out", "never-written.pth", *extra)


def resume_from(small_run, resume, out, *extra, config=None):
    return run_script("run.py", "--config", config or small_run["config"], "--tokens", small_run["tokens"],
                      "--resume", resume, "--out", out, *extra)


def write_config(tmp_path, name, **overrides):
    path = tmp_path / name
    path.write_text(yaml.safe_dump(tiny_config(**overrides)))
    return path


# --- resume files that must not load ------------------------------------------------------------


@pytest.mark.quick
def test_missing_resume_file(small_run, tmp_path):
    said(resume_refusal(small_run, tmp_path / "nope.pth"), "does not exist")


@pytest.mark.quick
def test_empty_resume_file(small_run, tmp_path):
    (tmp_path / "empty.pth").write_bytes(b"")
    said(resume_refusal(small_run, tmp_path / "empty.pth"), "is empty")


@pytest.mark.quick
def test_random_bytes(small_run, tmp_path):
    (tmp_path / "noise.pth").write_bytes(np.random.default_rng(0).bytes(4096))
    said(resume_refusal(small_run, tmp_path / "noise.pth"), "not a torch checkpoint")


@pytest.mark.quick
@pytest.mark.parametrize("fraction", [0.01, 0.3, 0.5, 0.9, 0.999])
def test_truncated_resume_file(small_run, tmp_path, fraction):
    data = small_run["resume"].read_bytes()
    (tmp_path / "cut.pth").write_bytes(data[: int(len(data) * fraction)])
    said(resume_refusal(small_run, tmp_path / "cut.pth"), "cut.pth")


@pytest.mark.quick
def test_zip_that_is_not_a_torch_file(small_run, tmp_path):
    with zipfile.ZipFile(tmp_path / "other.pth", "w") as z:
        z.writestr("hello.txt", "not a checkpoint")
    said(resume_refusal(small_run, tmp_path / "other.pth"), "not a torch checkpoint")


@pytest.mark.quick
def test_bare_tensor_is_not_a_resume_file(small_run, tmp_path):
    torch.save(torch.zeros(3), tmp_path / "tensor.pth")
    said(resume_refusal(small_run, tmp_path / "tensor.pth"), "Tensor")


@pytest.mark.quick
@pytest.mark.parametrize("key", ["model", "optimizer", "step", "gen_state", "fingerprint"])
def test_resume_file_missing_a_key(small_run, tmp_path, key):
    state = torch.load(small_run["resume"], weights_only=True)
    del state[key]
    torch.save(state, tmp_path / "partial.pth")
    said(resume_refusal(small_run, tmp_path / "partial.pth"), repr(key))


class Payload:
    """Unpickling this runs code: it writes a marker file."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


@pytest.mark.quick
def test_pickle_that_would_run_code_is_refused_and_never_runs(small_run, tmp_path):
    marker = tmp_path / "pwned"
    state = torch.load(small_run["resume"], weights_only=True)
    state["step"] = Payload(marker)
    torch.save(state, tmp_path / "evil.pth")
    assert not marker.exists()
    said(resume_refusal(small_run, tmp_path / "evil.pth"), "refusing to unpickle")
    assert not marker.exists()  # the payload never ran


def test_plain_pickle_file_is_refused(small_run, tmp_path):
    marker = tmp_path / "pwned"
    (tmp_path / "plain.pkl").write_bytes(pickle.dumps(Payload(marker)))
    proc = resume_from(small_run, tmp_path / "plain.pkl", tmp_path / "o.pth")
    assert_refused(proc, "plain.pkl", out=tmp_path / "o.pth")
    assert not marker.exists()


# --- resume files made under other settings -------------------------------------------------------


def other_resume(tmp_path, small_run, name, **overrides):
    cfg = write_config(tmp_path, f"{name}.yaml", **overrides)
    out = tmp_path / f"{name}.pth"
    proc = run_script("run.py", "--config", cfg, "--tokens", small_run["tokens"], "--stop-at", "2", "--out", out)
    assert proc.returncode == 0, proc.stderr
    return out


@pytest.mark.parametrize(
    "overrides, named",
    [
        ({"model": {"hidden_size": 32}}, "model.hidden_size 32 in the file, 64 now"),
        ({"steps": 13}, "steps 13 in the file, 12 now"),
        ({"threads": 2}, "threads 2 in the file, 1 now"),
    ],
)
def test_resume_made_under_other_settings_is_refused_naming_the_difference(small_run, tmp_path, overrides, named):
    resume = other_resume(tmp_path, small_run, "other", **overrides)
    said(resume_refusal(small_run, resume), named, "--allow-mismatch")


def test_allow_mismatch_continues_and_says_bit_exactness_is_lost(small_run, tmp_path):
    resume = other_resume(tmp_path, small_run, "other", steps=13)
    proc = resume_from(small_run, resume, tmp_path / "o.pth", "--allow-mismatch")
    assert proc.returncode == 0, proc.stderr
    assert "not be bit-exact" in proc.stderr and (tmp_path / "o.pth").exists()


def test_a_resume_under_another_cpu_kernel_dispatch_is_refused_naming_it(small_run, tmp_path):
    """Catches: a fingerprint without ATen's CPU capability, so a file saved with AVX2 (or AVX512) kernels is
    continued under others (ATEN_CPU_CAPABILITY, a requeue onto another node type) without a word."""
    native = torch.backends.cpu.get_cpu_capability()  # what the pipeline's jobs ran with: no variable set
    assert native != "DEFAULT", "this CPU has no vector kernels to fall back from"
    env = {**clean_env(), "ATEN_CPU_CAPABILITY": "default"}  # read at import: a fresh interpreter (launch.py)
    out = tmp_path / "o.pth"
    proc = run_script("run.py", "--config", small_run["config"], "--tokens", small_run["tokens"], "--resume",
                      small_run["resume"], "--out", out, env=env)
    assert_refused(proc, f"cpu_capability {native} in the file, DEFAULT now", "--allow-mismatch", out=out)
    proc = run_script("run.py", "--config", small_run["config"], "--tokens", small_run["tokens"], "--resume",
                      small_run["resume"], "--out", out, "--allow-mismatch", env=env)
    assert proc.returncode == 0 and "not be bit-exact" in proc.stderr, proc.stderr[-2000:]


def test_a_resume_from_other_training_code_is_refused_naming_the_module(small_run, tmp_path):
    """Catches: a fingerprint without the training code, so a checkpoint left in a folder after the clip
    value changed is continued as if nothing had; and one that counts a comment as code."""
    work = copy_workflow(tmp_path / "w")
    mmkit = work / "src" / "mmkit"
    train = (mmkit / "train.py").read_text()
    assert train.count("GRAD_CLIP = 1.0\n") == 1
    (mmkit / "train.py").write_text(train.replace("GRAD_CLIP = 1.0\n", "GRAD_CLIP = 0.5\n"))
    (mmkit / "model.py").write_text((mmkit / "model.py").read_text() + "# a comment is not code\n")
    out = tmp_path / "o.pth"
    cmd = [sys.executable, work / "workflow" / "scripts" / "run.py", "--config", small_run["config"], "--tokens",
           small_run["tokens"], "--resume", small_run["resume"], "--out", out]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=clean_env(work / "src"))
    assert_refused(proc, "code.train.py ", "--allow-mismatch", out=out)
    assert "model.py" not in proc.stderr
    proc = subprocess.run(cmd + ["--allow-mismatch"], capture_output=True, text=True, env=clean_env(work / "src"))
    assert proc.returncode == 0 and "not be bit-exact" in proc.stderr, proc.stderr[-2000:]


def test_other_model_dims_even_with_override_name_the_shape(small_run, tmp_path):
    resume = other_resume(tmp_path, small_run, "other", model={"hidden_size": 32})
    said(resume_refusal(small_run, resume, "--allow-mismatch"), "shape")


def test_a_resume_file_with_halved_weights_is_refused_unless_allow_mismatch(small_run, tmp_path):
    """halve_resume.py (the halfresume ablation's input): fp16 weights, fp32 AdamW state, and a fingerprint that
    says so. Catches: weights left in fp32 (then the file contradicts its fingerprint and even --allow-mismatch
    refuses it), the optimizer halved too, and a half-precision file resumed without a word."""
    half = tmp_path / "resume_fp16.pth"
    proc = run_script("halve_resume.py", "--resume", small_run["resume"], "--out", half)
    assert proc.returncode == 0, proc.stderr
    state = torch.load(half, weights_only=True)
    assert {str(t.dtype) for t in state["model"].values()} == {"torch.float16"}
    assert state["optimizer"]["state"][0]["exp_avg"].dtype == torch.float32  # only the weights were halved
    assert state["fingerprint"]["weights_dtype"] == "float16"
    said(resume_refusal(small_run, half), "weights_dtype float16 in the file", "--allow-mismatch")
    proc = resume_from(small_run, half, tmp_path / "o.pth", "--allow-mismatch")
    assert proc.returncode == 0 and "not be bit-exact" in proc.stderr, proc.stderr[-2000:]


def test_failed_resume_leaves_an_existing_output_untouched(small_run, tmp_path):
    out = tmp_path / "o.pth"
    out.write_bytes(b"previous result")
    (tmp_path / "empty.pth").write_bytes(b"")
    assert resume_from(small_run, tmp_path / "empty.pth", out).returncode == 2
    assert out.read_bytes() == b"previous result"


# --- token files and corpora ----------------------------------------------------------------------


@pytest.mark.quick
@pytest.mark.parametrize(
    "array, words",
    [
        (np.full(1000, 600, dtype=np.uint16), "outside 0..511"),
        (np.arange(10, dtype=np.uint16), "fewer than"),
        (np.zeros((40, 40), dtype=np.uint16), "1-D integer"),
        (np.zeros(1000, dtype=np.float32), "1-D integer"),
    ],
)
def test_bad_token_file(small_run, tmp_path, array, words):
    np.save(tmp_path / "tokens.npy", array)
    said(refusal("--config", small_run["config"], "--tokens", tmp_path / "tokens.npy", "--out", "never-written.pth"),
         words)


def test_token_file_that_is_not_npy(small_run, tmp_path):
    (tmp_path / "tokens.npy").write_text("hello")
    proc = run_script("run.py", "--config", small_run["config"], "--tokens", tmp_path / "tokens.npy",
                      "--out", tmp_path / "o.pth")
    assert_refused(proc, "not a .npy", out=tmp_path / "o.pth")


def prepare(tmp_path, corpus, env=None):
    settings = tmp_path / "tokenize.yaml"
    settings.write_text(yaml.safe_dump({"data": {"corpus": str(corpus) or None, "val_fraction": 0.1,
                                                 "tokenizer": None}, "model": {"vocab_size": 300}}))
    return run_script("prepare_data.py", "--config", settings, "--tokenizer", tmp_path / "tok.json",
                      "--jsonl", tmp_path / "train.jsonl", "--train", tmp_path / "train.npy",
                      "--val", tmp_path / "val.npy", env=env)


@pytest.mark.quick
def test_missing_corpus(tmp_path):
    assert_refused(prepare(tmp_path, tmp_path / "nope.txt"), "does not exist", out=tmp_path / "train.npy")


def test_jsonl_corpus_with_a_bad_line(tmp_path):
    (tmp_path / "c.jsonl").write_text('{"text": "fine"}\n{"txt": "no"}\n')
    assert_refused(prepare(tmp_path, tmp_path / "c.jsonl"), "line 2", out=tmp_path / "train.npy")


def test_python_without_pydoc_data_says_what_to_change(tmp_path):
    shadow = tmp_path / "shadow" / "pydoc_data"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("")  # a pydoc_data without topics, as a trimmed Python has
    env = clean_env(tmp_path / "shadow")
    assert_refused(prepare(tmp_path, "", env), "pydoc_data", "data.corpus", out=tmp_path / "train.npy")


def test_jsonl_and_txt_corpora_build_token_files(tmp_path):
    text = "The resume file holds the optimizer state. " * 200
    for corpus in (tmp_path / "c.jsonl", tmp_path / "c.txt"):
        corpus.write_text('{"text": "%s"}\n' % text if corpus.suffix == ".jsonl" else text)
        proc = prepare(tmp_path, corpus)
        assert proc.returncode == 0, proc.stderr
        train, val = np.load(tmp_path / "train.npy"), np.load(tmp_path / "val.npy")
        assert train.dtype == np.uint16 and val.dtype == np.uint16 and len(val) > 0 and train.max() < 300


@pytest.mark.parametrize("stop_at", ["0", "13"])
def test_stop_outside_the_run_is_refused(small_run, tmp_path, stop_at):
    proc = run_script("run.py", "--config", small_run["config"], "--tokens", small_run["tokens"],
                      "--stop-at", stop_at, "--out", tmp_path / "o.pth")
    assert_refused(proc, "nothing to train", out=tmp_path / "o.pth")


@pytest.mark.quick
def test_a_checkpoint_dir_that_is_a_dangling_symlink_is_refused_before_the_first_step(tmp_path):
    """Catches: a --checkpoint-dir that is a symlink to nothing taken for a folder still to make: the job trained
    up to its first checkpoint (step 4), then died on a FileExistsError traceback."""
    config = write_config(tmp_path, "c.yaml", checkpoint={"every": 4})
    np.save(tmp_path / "tokens.npy", np.arange(1000, dtype=np.uint16) % 512)
    (tmp_path / "checkpoints").symlink_to(tmp_path / "gone")
    proc = run_script("run.py", "--config", config, "--tokens", tmp_path / "tokens.npy", "--out", tmp_path / "o.pth",
                      "--checkpoint-dir", tmp_path / "checkpoints")
    assert_refused(proc, "--checkpoint-dir", "gone", out=tmp_path / "o.pth")
    assert not any(line.startswith("step ") for line in proc.stderr.splitlines())
    assert (tmp_path / "checkpoints").is_symlink() and not (tmp_path / "gone").exists()


# --- every range check, at its boundary from both sides ------------------------------------------


def train_one_step_on(small_run, tmp_path, tokens, refusal_words=None):
    """run.py on TOKENS for one step, in this process up to that step: its checks must let it start, or, given
    REFUSAL_WORDS, refuse it with them."""
    np.save(tmp_path / "tokens.npy", tokens)
    args = ("--config", small_run["config"], "--tokens", tmp_path / "tokens.npy", "--out", "never-written.pth",
            "--stop-at", 1)
    if refusal_words is None:
        until_first_step(*args)
    else:
        said(refusal(*args), *refusal_words)


@pytest.mark.quick
@pytest.mark.parametrize("ids, refused", [((0, 511), None), ((0, 512), ("token id 512", "outside 0..511")),
                                          ((0, 0), None), ((0, -1), ("token id -1",))])
def test_token_ids_at_the_edges_of_the_vocabulary(small_run, tmp_path, ids, refused):
    # TINY's vocabulary is 512: id 511 is the last one the embedding holds, 512 the first it does not
    train_one_step_on(small_run, tmp_path, np.resize(np.array(ids, dtype=np.int64), 200), refused)


@pytest.mark.quick
@pytest.mark.parametrize("length, refused", [(34, None), (33, ("fewer than the 34",))])
def test_token_file_just_long_enough_for_one_window(small_run, tmp_path, length, refused):
    # one window of seq_len 32 needs 32 inputs, the 32 next tokens, and one start: seq_len + 2 = 34
    train_one_step_on(small_run, tmp_path, np.arange(length, dtype=np.uint16), refused)


@pytest.mark.parametrize("stop_at, accepted", [(0, False), (1, True), (11, True), (12, False)])
def test_stop_at_at_the_edges_of_the_run(stop_at, accepted):
    from mmkit.config import check_config
    from mmkit.errors import UserError

    cfg = tiny_config(stop_at=stop_at)  # steps 12: a cut after step 1 .. 11 leaves something to resume
    if accepted:
        check_config(cfg)
    else:
        with pytest.raises(UserError, match="'stop_at'"):
            check_config(cfg)


# --- malformed settings: one line, exit 2, before anything is written ------------------------------------

MALFORMED = [float("nan"), float("inf"), float("-inf"), -1, 0, 2**64, 10**30, "2", "", None, True, [], {},
             "auto", 0.5, -0.5, 1e308]


def leaves(cfg, prefix=()):
    for k, v in cfg.items():
        yield from leaves(v, prefix + (k,)) if isinstance(v, dict) and v else [prefix + (k,)]


@pytest.mark.quick
def test_any_malformed_setting_is_one_line_and_exit_2_and_nothing_is_written(tmp_path_factory):
    """Catches: a value that passes the checks and fails later with a traceback (lr .nan, a seed torch cannot
    take), a key written twice taken silently, a refusal of several lines; property-based, 500 examples."""
    import contextlib
    import io

    from hypothesis import HealthCheck, given, settings, strategies as st

    from mmkit.config import load_config, run_config
    from mmkit.errors import run_cli

    base = tiny_config()
    keys = list(leaves(base))

    folder = tmp_path_factory.mktemp("malformed")

    @settings(max_examples=500, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(st.lists(st.tuples(st.sampled_from(keys), st.sampled_from(MALFORMED)), min_size=1, max_size=3),
           st.booleans())
    def check(edits, twice):
        cfg, final = yaml.safe_load(yaml.safe_dump(base)), {}
        for key, value in edits:
            node = cfg
            for k in key[:-1]:
                node = node[k]
            node[key[-1]] = final[key] = value
        text = yaml.safe_dump(cfg, sort_keys=False)
        if twice:  # a top-level key written again at the end, as a hand-edited file may have it
            text += f"steps: {cfg['steps']}\n"
        (folder / "c.yaml").write_text(text)
        err = io.StringIO()
        with contextlib.redirect_stderr(err), pytest.raises(SystemExit) as ended:
            run_cli(lambda: (run_config(load_config(folder / "c.yaml")), sys.exit(0)))
        lines = err.getvalue().strip().splitlines()
        assert [p.name for p in folder.iterdir()] == ["c.yaml"]
        # a key written twice, or a number that is no number, is always refused; other edits may be valid values
        if ended.value.code == 0 and not twice and all(v == v and v not in (float("inf"), float("-inf"))
                                                       for v in final.values() if isinstance(v, float)):
            return
        assert ended.value.code == 2 and len(lines) == 1 and lines[0].startswith("error: config "), lines
        assert "Traceback" not in err.getvalue()

    check()


@pytest.mark.quick
def test_any_malformed_command_line_of_run_py_is_one_line_and_exit_2_and_nothing_is_written(tmp_path_factory):
    """Catches: a bad command line answered with argparse's usage block (two lines or more) or a traceback,
    or one that writes a file before it is refused; property-based, 300 examples, each one defect among
    well-formed options in any order."""
    import contextlib
    import io

    from hypothesis import HealthCheck, given, settings, strategies as st
    from in_process import RUN_PY as run

    from mmkit.errors import run_cli
    from mmkit.ablations import ABLATIONS

    folder = tmp_path_factory.mktemp("command-lines")
    (folder / "config.yaml").write_text(yaml.safe_dump(tiny_config()))
    np.save(folder / "tokens.npy", np.arange(1000, dtype=np.uint16))
    before = sorted(p.name for p in folder.iterdir())
    well_formed = [["--config", "config.yaml"], ["--tokens", "tokens.npy"], ["--out", "out.pth"],
                   ["--loss-log", "loss.csv"], ["--checkpoint-dir", "checkpoints"], ["--timing", "timing.json"],
                   ["--allow-mismatch"], ["--stop-at", "3"]]
    defects = [["--bogus"], ["--stop-at", "three"], ["--config", "missing.yaml"], ["--reshard"],
               ["--minimind-rescale", "--resume", "resume.pth"], ["--out", "x", "extra-positional"],
               *([a.flag] for a in ABLATIONS.values())]  # an ablation, or --reshard, without --resume

    @settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(st.lists(st.sampled_from(well_formed), unique_by=lambda o: o[0], max_size=len(well_formed)),
           st.sampled_from(defects), st.randoms(use_true_random=False), st.booleans())
    def check(options, defect, order, value_missing):
        groups = [*options, defect]
        order.shuffle(groups)
        argv = [token for group in groups for token in group]
        if value_missing:  # an option left without its value at the end of the line
            argv.append(order.choice(["--config", "--out", "--stop-at", "--tokens"]))
        err = io.StringIO()
        with contextlib.chdir(folder), contextlib.redirect_stderr(err), pytest.raises(SystemExit) as ended:
            sys.argv = ["run.py", *argv]
            run_cli(run.main)
        lines = err.getvalue().strip().splitlines()
        assert ended.value.code == 2 and len(lines) == 1 and lines[0].startswith("error: "), (argv, lines)
        assert sorted(p.name for p in folder.iterdir()) == before, argv

    argv = sys.argv
    try:
        check()
    finally:
        sys.argv = argv

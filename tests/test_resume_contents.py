"""A resume file's contents are checked whole before a step runs; NaN and Inf never pass unnoticed.

The property test edits a real resume file at random, as a user or a flipped bit might: the run must
either refuse it with one `error:` line and write nothing, or end bit for bit where the straight run
ends. Never a traceback, never a silently different model.

The many cases of each check call run.py's own code in this process (tests/in_process.py); one case per
check also runs as a real `run.py`, for the exit status, the one last line and nothing written.
"""

import collections
import math

import pytest
import torch
import yaml
from conftest import assert_same_state_dict, run_script, tiny_config
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from in_process import refusal as refused_in_process
from in_process import until_first_step
from mmkit.errors import UserError
from mmkit.checkpoint.entries import seal



def resume_args(small_run, resume_file, *extra, config=None) -> list:
    return ["--config", config or small_run["config"], "--tokens", small_run["tokens"], "--resume", resume_file,
            "--out", "never-written.pth", *extra]


def in_process(small_run, resume_file, *extra) -> str:
    """The line run.py refuses RESUME_FILE with, from its own code in this process (fails if it is accepted)."""
    return refused_in_process(*resume_args(small_run, resume_file, *extra))


def resume(small_run, resume_file, out, *extra, config=None):
    return run_script("run.py", "--config", config or small_run["config"], "--tokens", small_run["tokens"],
                      "--resume", resume_file, "--out", out, *extra)


def refusal(proc, out) -> str:
    """The one error line of a refused run (exit 2, nothing written); fails on anything else."""
    lines = proc.stderr.strip().splitlines()
    errors = [line for line in lines if line.startswith("error: ")]
    assert proc.returncode == 2 and len(errors) == 1 and lines[-1] == errors[0], proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    assert not out.exists() and not out.with_name(out.name + ".tmp").exists()
    return errors[0]


def edited(small_run, tmp_path, edit, name="edited.pth", reseal=True):
    """The tiny run's resume file with EDIT applied and, unless RESEAL is off, its digests recomputed: so
    the check of the edited entry alone must refuse it, not the sha256 comparison behind it."""
    state = torch.load(small_run["resume"], weights_only=True)
    edit(state)
    if reseal:
        state = seal({k: v for k, v in state.items() if k != "digests"})
    path = tmp_path / name
    torch.save(state, path)
    return path


# --- each class of contents, refused with a line naming the entry ------------------------------


# each refused by its entry's own check: the digests are recomputed after the edit (edited(reseal=True)),
# so a check that let its case through would let the file through
@pytest.mark.quick
@pytest.mark.parametrize("edit, words", [
    (lambda s: s["optimizer"].__setitem__("state", {}), ["'optimizer'", "0 parameters"]),
    (lambda s: s.__setitem__("gen_state", s["gen_state"][:100]), ["'gen_state'", "shape [100]"]),
    (lambda s: s.__setitem__("gen_state", torch.Generator().manual_seed(8).get_state()),
     ["'gen_state'", "data position"]),
    (lambda s: s.__setitem__("step", True), ["'step'", "bool"]),
    (lambda s: s.__setitem__("step", 4), ["'optimizer'", "4 updates"]),
    (lambda s: s.__setitem__("adamw_offset", 3), ["'optimizer'", "2 updates"]),
    (lambda s: s.__setitem__("adamw_offset", 6), ["'adamw_offset'", "0..steps (12)"]),
    (lambda s: s.__setitem__("adamw_offset", -8), ["'adamw_offset'", "0..steps (12)"]),
    (lambda s: s.__setitem__("step", 12), ["'step'", "1..11"]),
    (lambda s: s.__setitem__("step", 0), ["'step'", "1..11"]),
    (lambda s: s["model"]["model.norm.weight"].__setitem__(0, math.nan), ["'model'", "model.norm.weight",
                                                                         "non-finite"]),
    (lambda s: s["model"].__setitem__("lm_head.weight", s["model"]["lm_head.weight"] + 1),
     ["'model'", "lm_head.weight", "ties"]),
    (lambda s: s["model"].__setitem__("model.norm.weight", s["model"]["model.norm.weight"].double()),
     ["'model'", "float64", "float32"]),
    (lambda s: s["optimizer"]["state"][0].__setitem__("exp_avg_sq", -s["optimizer"]["state"][0]["exp_avg_sq"] - 1),
     ["'optimizer'", "negative"]),
    (lambda s: s["optimizer"]["state"][2]["exp_avg"].__setitem__(0, math.inf), ["'optimizer'", "non-finite"]),
    (lambda s: s["optimizer"]["param_groups"][0].__setitem__("betas", (0.8, 0.99)), ["'optimizer'", "betas"]),
    (lambda s: s["optimizer"]["state"][3].__setitem__("exp_avg", s["optimizer"]["state"][3]["exp_avg"][:-1]),
     ["'optimizer'", "exp_avg of parameter 3"]),
    (lambda s: s.__setitem__("skipped_steps", s["step"] + 1), ["'skipped_steps'", "0..step"]),
    (lambda s: s["data_position"].__setitem__("batch", s["data_position"]["batch"] + 1),
     ["'data_position'", "this run reads from"]),
    (lambda s: s["rng_state"].__setitem__("cpu", s["rng_state"]["cpu"][:100]), ["'rng_state'", "not a cpu RNG state"]),
    (lambda s: s.__setitem__("scaler", {"scale": 1024.0}), ["'scaler'", "no fp16 loss scaling"]),
    (lambda s: s.__setitem__("loss_log", s["loss_log"][::-1]), ["'loss_log'", "consecutive steps"]),
    # an older format that lacked an entry: refused by its version, not by the entry it lacks
    (lambda s: (s["fingerprint"].__setitem__("format", s["fingerprint"]["format"] - 1), s.pop("scaler")),
     ["has format", "this code reads"]),
], ids=["empty-optimizer", "gen-truncated", "gen-other-seed", "step-bool", "step-4", "adamw-offset-3",
        "adamw-offset-6", "adamw-offset--8", "step-12", "step-0",
        "nan-weight", "untied", "float64-weight", "negative-exp-avg-sq", "inf-exp-avg", "other-betas",
        "short-exp-avg", "skipped-past-step", "data-position-ahead", "rng-truncated", "scaler-without-fp16",
        "loss-log-reversed", "older-format-lacking-an-entry"])
def test_resume_file_with_bad_contents_is_refused_naming_the_entry(small_run, tmp_path, edit, words):
    """Catches: any entry check removed or loosened (the digests are resealed, so nothing else refuses it)."""
    error = in_process(small_run, edited(small_run, tmp_path, edit))
    assert "sha256" not in error, error  # resealed: the digests match, the entry's own check must speak
    for w in words:
        assert w in error, error


# same shape and every value plausible: only the sha256 recorded at save time can tell (not resealed)
@pytest.mark.quick
@pytest.mark.parametrize("edit, entry", [
    (lambda s: s["optimizer"]["state"][0]["exp_avg"].mul_(1.5), "optimizer"),
    (lambda s: s["model"]["model.norm.weight"].add_(1e-3), "model"),
    (lambda s: s["data_position"].__setitem__("batch", s["data_position"]["batch"]), None),
], ids=["scaled-exp-avg", "nudged-weight", "untouched"])
def test_an_edit_no_check_sees_is_refused_by_the_digest(small_run, tmp_path, edit, entry):
    """Catches: digests not compared, or not per entry; a digest so loose that an untouched resave fails it."""
    path = edited(small_run, tmp_path, edit, reseal=False)
    if entry is None:  # the control: an edit that changes nothing is not refused (the digests are exact)
        live, *_ = until_first_step(*resume_args(small_run, path))
        assert live.step == torch.load(path, weights_only=True)["step"]
        return
    error = in_process(small_run, path)
    assert f"'{entry}'" in error and "sha256" in error, error


def test_a_refused_resume_file_is_one_error_line_exit_2_and_nothing_written(small_run, tmp_path):
    """Catches: a refusal of the entry checks that tracebacks, exits 0 or 1, or writes its output anyway, in
    the real command (the cases above call the checks in-process)."""
    out = tmp_path / "o.pth"
    path = edited(small_run, tmp_path, lambda s: s["optimizer"].__setitem__("state", {}))
    error = refusal(resume(small_run, path, out), out)
    assert "'optimizer'" in error and "0 parameters" in error, error


def test_no_optim_ignores_an_incomplete_optimizer_state_by_name(small_run, tmp_path):
    path = edited(small_run, tmp_path, lambda s: s["optimizer"].__setitem__("state", {}))
    proc = resume(small_run, path, tmp_path / "o.pth", "--no-optim")
    assert proc.returncode == 0, proc.stderr
    assert "ignoring entry 'optimizer'" in proc.stderr
    # the same as --no-optim on the intact file: the entry really was thrown away, not half used
    intact = resume(small_run, small_run["resume"], tmp_path / "intact.pth", "--no-optim")
    assert intact.returncode == 0
    assert_same_state_dict(torch.load(tmp_path / "o.pth", weights_only=True),
                           torch.load(tmp_path / "intact.pth", weights_only=True))


# --- non-finite numbers during training ---------------------------------------------------------


def test_a_nan_loss_stops_training_with_its_own_exit_and_writes_nothing(tmp_path, small_run):
    config = tmp_path / "hot.yaml"
    config.write_text(yaml.safe_dump(tiny_config(lr=1.0e8)))
    out, log = tmp_path / "o.pth", tmp_path / "o.csv"
    out.write_bytes(b"an earlier checkpoint")
    proc = run_script("run.py", "--config", config, "--tokens", small_run["tokens"], "--out", out, "--loss-log", log)
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert proc.returncode == 3 and len(errors) == 1, proc.stderr
    step = int(errors[0].split("step ")[1].split(":")[0])
    assert f"step {step - 1:>4}/" in proc.stderr and f"step {step:>4}/" not in proc.stderr  # the last step logged
    assert "first non-finite gradient: " in errors[0]
    assert out.read_bytes() == b"an earlier checkpoint" and not log.exists()


def test_nonfinite_skip_leaves_the_weights_untouched_for_that_step_and_logs_it(tmp_path, small_run):
    config = tmp_path / "skip.yaml"
    config.write_text(yaml.safe_dump(tiny_config(lr=1.0e8, nonfinite="skip")))
    out, timing = tmp_path / "o.pth", tmp_path / "t.json"
    proc = run_script("run.py", "--config", config, "--tokens", small_run["tokens"], "--out", out,
                      "--timing", timing, "--stop-at", "8")
    assert proc.returncode == 0, proc.stderr
    skipped_lines = [line for line in proc.stderr.splitlines() if "skipped: non-finite" in line]
    state = torch.load(out, weights_only=True)
    assert state["skipped_steps"] == len(skipped_lines) > 0
    assert all(torch.isfinite(t).all() for t in state["model"].values())  # no NaN reached the weights
    # AdamW counted only the updates it made
    assert all(s["step"].item() == 8 - len(skipped_lines) for s in state["optimizer"]["state"].values())
    assert yaml.safe_load(timing.read_text())["skipped_steps"] == len(skipped_lines)


# --- compare.py never hides a NaN ---------------------------------------------------------------


@pytest.mark.quick
def test_compare_reports_nan_and_never_a_finite_max_around_it(tmp_path):
    a = {"w": torch.tensor([1.0, 2.0, 3.0]), "v": torch.tensor([1.0, 2.0]), "u": torch.tensor([1.0])}
    b = {"w": torch.tensor([1.0, math.nan, 3.0]), "v": torch.tensor([1.0, 2.5]), "u": torch.tensor([math.inf])}
    torch.save(a, tmp_path / "a.pth")
    torch.save(b, tmp_path / "b.pth")
    proc = run_script("compare.py", tmp_path / "a.pth", tmp_path / "b.pth")
    assert proc.returncode == 1
    for name in ("w", "u"):  # an Inf too: its |diff| is inf, a number that says nothing of the rest
        line = next(line for line in proc.stdout.splitlines() if line.endswith(f"  {name}"))
        assert line.startswith("DIFF  non-finite values (A: 0, B: 1)"), line
    assert proc.stdout.splitlines()[-1] == \
        "3 of 3 tensors differ; max |diff| 5.000e-01 over the finite ones; 2 hold NaN/Inf"
    # the same NaN on both sides, bit for bit, is the same tensor
    torch.save(b, tmp_path / "b2.pth")
    same = run_script("compare.py", tmp_path / "b.pth", tmp_path / "b2.pth")
    assert same.returncode == 0 and same.stdout.splitlines()[-1] == "0 of 3 tensors differ; max |diff| 0.000e+00"


# --- the property: any edit is refused in one line, or harmless ---------------------------------


def tensor_paths(state):
    """Addresses of every tensor of the file: ('model', name), ('optimizer', 'state', i, key), ('gen_state',)."""
    paths = [("model", k) for k in state["model"]]
    paths += [("optimizer", "state", i, k) for i, s in state["optimizer"]["state"].items() for k in s]
    return paths + [("gen_state",)]


def get(state, path):
    for k in path:
        state = state[k]
    return state


def put(state, path, value):
    get(state, path[:-1])[path[-1]] = value


MUTATIONS = ["drop entry", "retype entry", "reshape tensor", "slice tensor", "change dtype", "insert nan/inf",
             "change step", "shuffle optimizer state", "empty optimizer state", "swap generator state",
             "drop model tensor", "change hyperparameter", "nudge a value", "resave unchanged"]
EXAMPLES = 60  # random edits tried, in-process; the ones run.py accepts then run as a real process (about 3 s)
OUTCOMES = collections.Counter()


@st.composite
def mutation(draw, state):
    kind = draw(st.sampled_from(MUTATIONS))
    paths = tensor_paths(state)
    if kind == "drop entry":
        return kind, draw(st.sampled_from(sorted(state)))
    if kind == "retype entry":
        return kind, (draw(st.sampled_from(sorted(state))),
                      draw(st.sampled_from([None, "x", 3, 2.5, True, [], {}, (1, 2)])))
    if kind in ("reshape tensor", "slice tensor", "change dtype", "insert nan/inf", "nudge a value"):
        path = draw(st.sampled_from(paths))
        if kind == "change dtype":
            return kind, (path, draw(st.sampled_from(["float64", "float16", "bfloat16", "int64", "uint8"])))
        if kind == "insert nan/inf":
            return kind, (path, draw(st.sampled_from([math.nan, math.inf, -math.inf])), draw(st.integers(0, 10**6)))
        if kind == "nudge a value":
            return kind, (path, draw(st.integers(0, 10**6)))
        return kind, path
    if kind == "change step":
        return kind, draw(st.sampled_from([-1, 0, 1, 2, 4, 6, 11, 12, 100, 5.0, True]))
    if kind == "shuffle optimizer state":
        return kind, draw(st.permutations(sorted(state["optimizer"]["state"])))
    if kind == "swap generator state":
        return kind, (draw(st.integers(0, 10)), draw(st.integers(0, 12)))
    if kind == "drop model tensor":
        return kind, draw(st.sampled_from(sorted(state["model"])))
    if kind == "change hyperparameter":
        key = draw(st.sampled_from(["betas", "eps", "weight_decay", "amsgrad", "maximize", "lr"]))
        return kind, (key, draw(st.sampled_from([(0.8, 0.99), 1e-6, 0.0, True, 0.5])))
    return kind, None


def apply(state, kind, arg):
    if kind == "drop entry":
        del state[arg]
    elif kind == "retype entry":
        state[arg[0]] = arg[1]
    elif kind == "reshape tensor":
        t = get(state, arg)
        put(state, arg, t.reshape(-1, 1) if t.dim() != 2 else t.t().contiguous())
    elif kind == "slice tensor":
        t = get(state, arg)
        put(state, arg, t.reshape(-1)[:-1] if t.dim() == 0 else t[:-1])
    elif kind == "change dtype":
        path, dtype = arg
        put(state, path, get(state, path).to(getattr(torch, dtype)))
    elif kind == "insert nan/inf":
        path, value, index = arg
        t = get(state, path).clone()
        if t.is_floating_point() and t.numel():
            t.view(-1)[index % t.numel()] = value
        else:  # an integer tensor cannot hold NaN: the nearest edit is an out-of-range value
            t.view(-1)[index % max(t.numel(), 1)] = 255 if t.dtype == torch.uint8 else -1
        put(state, path, t)
    elif kind == "nudge a value":
        path, index = arg
        t = get(state, path).clone()
        flat = t.view(-1)
        if t.numel():
            flat[index % t.numel()] = flat[index % t.numel()] + (1 if not t.is_floating_point() else 1e-3)
        put(state, path, t)
    elif kind == "change step":
        state["step"] = arg
    elif kind == "shuffle optimizer state":
        entries = state["optimizer"]["state"]
        state["optimizer"]["state"] = {new: entries[old] for old, new in zip(sorted(entries), arg)}
    elif kind == "empty optimizer state":
        state["optimizer"]["state"] = {}
    elif kind == "swap generator state":
        seed, draws = arg
        g = torch.Generator().manual_seed(seed)
        for _ in range(draws):
            torch.randint(0, 100, (4,), generator=g)
        state["gen_state"] = g.get_state()
    elif kind == "drop model tensor":
        del state["model"][arg]
    elif kind == "change hyperparameter":
        key, value = arg
        state["optimizer"]["param_groups"][0][key] = value


@pytest.fixture(scope="module")
def straight_weights(small_run):
    return torch.load(small_run["straight"], weights_only=True)


@pytest.mark.quick
def test_any_edit_of_a_resume_file_is_refused_in_one_line_or_harmless(small_run, straight_weights,
                                                                     tmp_path_factory):
    original = torch.load(small_run["resume"], weights_only=True)
    tmp = tmp_path_factory.mktemp("mutants")

    @settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(st.data())
    def check(data):
        kind, arg = data.draw(mutation(original))
        state = torch.load(small_run["resume"], weights_only=True)
        apply(state, kind, arg)
        path, out = tmp / "mutant.pth", tmp / "out.pth"
        out.unlink(missing_ok=True)
        torch.save(state, path)
        try:
            until_first_step(*resume_args(small_run, path))
        except UserError:  # refused: then as run.py's one line, exit 2 (refusal() says so, or fails)
            error = in_process(small_run, path)
            OUTCOMES[kind, "refused: " + error.split(": entry ")[-1].split("'")[1]
                     if ": entry '" in error else "refused: " + error.split(str(path))[-1][:40]] += 1
            return
        except Exception as e:  # noqa: BLE001 - what run.py would print as a traceback
            pytest.fail(f"{kind} {arg}: run.py would end in a traceback: {type(e).__name__}: {e}")
        # accepted: then it must be harmless, run to the end by the real command
        proc = resume(small_run, path, out)
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert_same_state_dict(torch.load(out, weights_only=True), straight_weights)
        OUTCOMES[kind, "harmless, bit-exact"] += 1

    check()
    print("\nmutation outcomes:")
    for (kind, outcome), n in sorted(OUTCOMES.items()):
        print(f"  {kind:26} {outcome:40} {n}")
    assert sum(OUTCOMES.values()) == EXAMPLES


# --- the fingerprint: every setting a bit-exact continuation depends on, each one checked -------------

FINGERPRINT = {"format", "torch", "threads", "device", "precision", "adamw", "weights_dtype", "nonfinite", "seed", "steps",
               "batch_size", "seq_len", "lr", "accumulation_steps", "data_format", "train_data_sha256",
               "model.arch", "model.dropout", "model.flash_attn", "model.hidden_size", "model.num_hidden_layers",
               "model.num_attention_heads", "model.num_key_value_heads", "model.vocab_size",
               "model.max_position_embeddings", "model.rms_norm_eps", "model.rope_theta",
               "world_size", "strategy", "batch_slices", "rank_generators", "backend", "cpu_capability",
               "cpu_kernels", "gpu",
               "code.model.py", "code.train.py", "code.data.py", "code.parallel.py"}


def flat(d, prefix=""):
    out = {}
    for k, v in d.items():
        out.update(flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {prefix + k: v})
    return out


@pytest.mark.quick
def test_a_resume_file_records_every_setting_the_continuation_depends_on(small_run, tmp_path):
    """Catches: a setting left out of the fingerprint; the CPU kernels bf16 dispatches to not recorded."""
    saved = torch.load(small_run["resume"], weights_only=True)["fingerprint"]  # a file run.py wrote
    assert set(flat(saved)) == FINGERPRINT
    assert saved["cpu_kernels"] == [] and saved["gpu"] is None  # fp32 on a CPU: no half-precision kernels
    # bf16 on this CPU: the features that choose oneDNN's bf16 and fp16 kernels, read here from /proc/cpuinfo
    flags = next(line for line in open("/proc/cpuinfo") if line.startswith("flags")).split(":", 1)[1].split()
    config = tmp_path / "bf16.yaml"
    config.write_text(yaml.safe_dump({**yaml.safe_load(small_run["config"].read_text()), "precision": "bf16"}))
    live, *_ = until_first_step("--config", config, "--tokens", small_run["tokens"], "--out", tmp_path / "o.pth",
                                "--stop-at", 2)
    assert live.fingerprint["cpu_kernels"] == sorted({"amx_bf16", "amx_fp16", "avx512_bf16", "avx512_fp16"} & set(flags))


def other_value(v):
    if v is None:  # gpu, off CUDA
        return "NVIDIA H200; CUDA 12.8; cuDNN 91000; deterministic algorithms True"
    if isinstance(v, list):  # cpu_kernels
        return v + ["amx_bf16"] if "amx_bf16" not in v else v[1:]
    if isinstance(v, bool):
        return not v
    if isinstance(v, int):
        return v + 1
    if isinstance(v, float):
        return v * 2 if v else 0.5
    return v + "-other"


@pytest.mark.quick
@pytest.mark.parametrize("key", sorted(FINGERPRINT))
def test_a_resume_file_from_other_settings_is_refused_for_each_fingerprint_key(small_run, tmp_path, key):
    def edit(state):
        d, rest = state["fingerprint"], key
        while rest not in d:  # model.hidden_size, code.train.py: the names may hold dots themselves
            parent, rest = rest.split(".", 1)
            d = d[parent]
        d[rest] = other_value(d[rest])

    error = in_process(small_run, edited(small_run, tmp_path, edit))
    assert (f"{key} " in error and "in the file" in error) or (key == "format" and "has format" in error), error

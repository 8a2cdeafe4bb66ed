"""certify on unmodified command lines: this project's run.py, a plain loop (one process and torchrun), a
Trainer script under torchrun, a Lightning script; the verdict each gets, the kill, and every bad input.

Every run is certify's own command line in a real process, and certify's runs are real processes it starts.
Where the verdict says exact, the final weights of the straight and the resumed run (two processes) are
compared tensor by tensor as well; where a bug was planted, the piece it must be named by follows from the
bug (a forgotten generator changes the next batch; rank 1's forgotten RNG changes its dropout draws).
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import jsonschema
import numpy as np
import pytest
import torch
import yaml
from certkit.runs import SITE  # the recorder's sitecustomize, in the installed package
from conftest import REPO, assert_same_state_dict, clean_env, same_state_dict, tiny_config

CERTIFY = [sys.executable, "-m", "certkit"]  # the installed package (certify/), as `certify` runs it
PLAIN = [sys.executable, str(REPO / "examples" / "plain_loop.py"), "--out", "{run}"]
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
ENV = {**clean_env(), "OMP_NUM_THREADS": "1"}


def certify(out, stop_after, command, resume="", *options, cwd=None):
    proc = subprocess.run([*CERTIFY, "--out", str(out), "--stop-after", str(stop_after), f"--resume={resume}",
                           *options, "--", *map(str, command)], capture_output=True, text=True, env=ENV,
                          timeout=600, cwd=cwd)
    verdict = json.loads((out / "verdict.json").read_text()) if (out / "verdict.json").exists() else None
    return proc, verdict


def final_checkpoint(out, name):
    return {run: torch.load(out / "runs" / run / name, weights_only=True) for run in ("straight", "resumed")}


@pytest.mark.quick
def test_a_digest_sees_one_changed_byte_two_swapped_words_and_nothing_else():
    """Catches: a digest blind to a change (a sum of words sees no swap; a hash of the first bytes misses the
    last chunk), or one that draws from an RNG or depends on the object rather than its bytes."""
    from certkit import digest

    t = torch.arange(3 * digest.CHUNK_WORDS, dtype=torch.float64)  # three chunks
    before = torch.get_rng_state()
    reference = digest.of_tensors([t])
    assert digest.of_tensors([t.clone()]) == reference and torch.equal(torch.get_rng_state(), before)
    flipped = t.clone()
    flipped.view(torch.uint8)[-1] ^= 1  # the last byte of the last chunk
    swapped = t.clone()
    swapped[[5, 6]] = swapped[[6, 5]]
    across = t.clone()
    across[[5, digest.CHUNK_WORDS + 5]] = across[[digest.CHUNK_WORDS + 5, 5]]  # same place in two chunks
    found = {digest.of_tensors([x]) for x in (flipped, swapped, across, t.view(3, -1), t.float())}
    assert len(found) == 5 and reference not in found


def test_the_recorder_changes_no_bit_of_what_a_process_computes(tmp_path):
    """Catches: a hook that draws from an RNG, moves a tensor or reorders the data (a certificate of a run
    other than the user's)."""
    runs = {}
    for name, env in (("plain", clean_env()),
                      ("recorded", {**clean_env(), "PYTHONPATH": str(SITE),
                                    "CERTIFY_RECORD": str(tmp_path / "certificate")})):
        subprocess.run([*PLAIN[:2], "--out", tmp_path / name, "--steps", "6", "--dropout", "0.1"], env=env,
                       check=True, capture_output=True)
        runs[name] = torch.load(tmp_path / name / "step_6.pt", weights_only=True)
    assert_same_state_dict(runs["plain"]["model"], runs["recorded"]["model"])
    rows = (tmp_path / "certificate" / "rank0.jsonl").read_text().splitlines()
    assert [json.loads(r)["step"] for r in rows] == [1, 2, 3, 4, 5, 6]


def test_a_plain_loop_that_forgets_its_generator_is_named_samples_at_the_first_resumed_step(tmp_path):
    """Catches: a piece named out of causal order, a first step counted from the kill rather than from the
    checkpoint (--lose 2: the steps lost between them are trained again), a verdict of exact on a forgotten
    shuffle order (the cut is past the first epoch: a fresh generator draws the first epoch's order again);
    two resumes (--again) whose second leg does not start from the first leg's own checkpoint, or whose
    steps are not both legs'; the example resumed at an epoch's last step drawing that epoch's order again."""
    proc, verdict = certify(tmp_path / "forgets", 10, PLAIN, "--resume {run}/step_{step}.pt --forget generator",
                            "--lose", "2", "--repair")
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert (verdict["first"]["step"], verdict["first"]["rank"], verdict["first"]["piece"]) == (11, 0, "samples")
    # the straight run's inputs replayed into a fourth run: exact, and its weights are the straight run's
    assert verdict["repair"] == {"restored": ["samples"], "exact": True, "first": None}
    repaired = torch.load(tmp_path / "forgets" / "runs" / "repaired" / "step_16.pt", weights_only=True)
    final = final_checkpoint(tmp_path / "forgets", "step_16.pt")
    assert_same_state_dict(final["straight"]["model"], repaired["model"])
    assert verdict["killed_at"] == {"0": 13} and verdict["steps"]["stopped"] == {"0": [1, 12]}
    # the same loop, resuming what it saved, twice (--again 13: the resumed run killed again before step 14):
    # exact, and so are its weights; the first cut at an epoch's last step (8 of 8: a loop that resumes from
    # that epoch's shuffle state with nothing to skip draws the finished epoch's order again)
    proc, verdict = certify(tmp_path / "keeps", 8, PLAIN, "--resume {run}/step_{step}.pt", "--again", "13")
    assert proc.returncode == 0 and verdict["exact"], proc.stderr[-2000:]
    weights = final_checkpoint(tmp_path / "keeps", "step_16.pt")
    assert_same_state_dict(weights["straight"]["model"], weights["resumed"]["model"])
    # the two legs: the first from step 8's checkpoint, killed before 14's update; the second from its own 13
    legs = [[json.loads(line) for line in (tmp_path / "keeps" / leg / "rank0.jsonl").open()]
            for leg in ("resumed.first", "resumed")]
    assert [r.get("step", r.get("killed")) for r in legs[0]] == [9, 10, 11, 12, 13, 14] and "killed" in legs[0][-1]
    # (had the second leg loaded step 8's checkpoint, its steps 14.. would be 9..'s: not exact)
    assert [r["step"] for r in legs[1]] == [14, 15, 16] and verdict["steps"]["resumed"] == {"0": [9, 16]}


@pytest.mark.slow
def test_an_emptied_optimizer_state_is_named_optimizer_state_and_so_is_certifys_own_control(tmp_path):
    """Catches: AdamW's moments not recorded, or recorded after the parameters (named as weights), or a
    diagnosis that does not say the resume started from an empty optimizer state; a max |Δw|
    that is not that of the final weights; a negative control (--control) that does not empty the optimizer,
    or is called caught at another step or piece."""
    short = [*PLAIN, "--steps", "8"]
    proc, verdict = certify(tmp_path / "forgets", 5, short, "--resume {run}/step_{step}.pt --forget optimizer",
                            "--full")
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert (verdict["first"]["step"], verdict["first"]["piece"]) == (6, "optimizer")
    assert verdict["first"]["pieces"] == {"0": ["optimizer", "params"]}
    # its resume left AdamW's per-parameter state out (plain_loop.py --forget optimizer): so says the diagnosis
    [cause] = verdict["diagnosis"]["causes"]
    assert cause["class"] == "optimizer_not_restored" and "empty optimizer state" in cause["evidence"], cause
    final = {run: w["model"] for run, w in final_checkpoint(tmp_path / "forgets", "step_8.pt").items()}
    gap = max(float((final["straight"][k] - final["resumed"][k]).abs().max()) for k in final["straight"])
    assert gap > 0 and verdict["max_abs_dw"] == pytest.approx(gap, rel=1e-6)
    # the script's resume kept, certify's control empties the optimizer in a run of its own
    proc, verdict = certify(tmp_path / "control", 5, short, "--resume {run}/step_{step}.pt", "--control")
    assert proc.returncode == 0 and verdict["exact"] and verdict["max_abs_dw"] == 0.0, proc.stderr[-2000:]
    control = verdict["control"]
    assert control["caught"] and (control["first"]["step"], control["first"]["piece"]) == (6, "optimizer")
    emptied, straight = ([json.loads(line) for line in (tmp_path / "control" / run / "rank0.jsonl").open()]
                         for run in ("control", "straight"))
    first = emptied[0]
    assert first["step"] == 6 and first["gradients"] == straight[5]["gradients"]
    assert first["optimizer"] != straight[5]["optimizer"]


@pytest.mark.slow
def test_ddp_under_torchrun_that_forgets_rank_1s_rng_is_named_rank_1_rng_and_the_repair_confirms_it(tmp_path):
    """Catches: one rank's certificate only, a rank named by its number rather than by the earliest piece
    (rank 0 differs at the same step, in the gradients the all-reduce carried over), a kill that leaves a
    rank or torchrun running; a repair that restores the RNG states at the wrong point or of the wrong rank
    (the repaired run, a fourth process group, must then match the straight run at every step)."""
    command = [*TORCHRUN, REPO / "examples" / "plain_loop.py", "--dropout", "0.1", "--out", "{run}", "--steps", "6"]
    proc, verdict = certify(tmp_path, 4, command, "--resume {run}/step_{step}.pt --forget rng-rank1", "--repair")
    assert proc.returncode == 1, proc.stderr[-2000:]
    first = verdict["first"]
    assert (first["step"], first["rank"], first["piece"]) == (5, 1, "rng_torch")
    assert first["pieces"]["0"][0] == "gradients"
    assert verdict["repair"] == {"restored": ["rng"], "exact": True, "first": None}
    weights = {run: torch.load(tmp_path / "runs" / run / "step_6.pt", weights_only=True)
               for run in ("straight", "resumed", "repaired")}
    assert_same_state_dict(weights["straight"]["model"], weights["repaired"]["model"])
    assert not same_state_dict(weights["straight"]["model"], weights["resumed"]["model"])
    assert set(verdict["steps"]["straight"]) == {"0", "1"}
    # no process of its runs left (each names its folder under tmp_path), whatever else runs on the machine
    assert str(tmp_path) not in subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout


def test_a_torchrun_command_resumed_on_one_process_by_resume_command_is_judged_on_rank_0(tmp_path):
    """Catches: --resume-command not run (the resumed run would have 2 ranks again) or run for the straight or
    stopped run; a verdict that does not say it was resumed on fewer ranks; the final weights compared on a
    rank the resumed run lacks (no number then). The plain loop shards the data with a DistributedSampler on 2
    ranks and shuffles it whole on 1: the update's inputs differ from the first resumed step, as gradients."""
    script = [REPO / "examples" / "plain_loop.py", "--out", "{run}", "--steps", "6"]
    proc, verdict = certify(tmp_path, 3, [*TORCHRUN, *script], "--resume {run}/step_{step}.pt",
                            "--resume-command", " ".join(map(str, [sys.executable, *script])))
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert verdict["ranks"] == {"straight": 2, "resumed": 1}
    assert verdict["steps"]["straight"] == {"0": [1, 6], "1": [1, 6]} and verdict["steps"]["resumed"] == {"0": [4, 6]}
    assert (verdict["first"]["step"], verdict["first"]["rank"], verdict["first"]["piece"]) == (4, 0, "gradients")
    final = {run: torch.load(tmp_path / run / "rank0.final.pt", weights_only=True) for run in ("straight", "resumed")}
    gap = max(float((a.double() - b.double()).abs().max()) for a, b in zip(final["straight"], final["resumed"]))
    assert gap > 0 and verdict["max_abs_dw"] == gap
    assert "Resumed on 1 rank of 2" in (tmp_path / "verdict.md").read_text()


@pytest.mark.quick
def test_a_resume_on_fewer_ranks_is_judged_on_the_ranks_both_have_in_what_the_update_computes_from():
    """Catches: a resume on another number of ranks called not exact for the rank it no longer has, or for its
    own samples and RNG (one process takes both ranks' micro-batches); the update's pieces left uncompared
    there; that leniency reaching a resume without --resume-command, or one on as many ranks."""
    from certkit import verdict

    def row(step, rank, world, **changed):
        return {"step": step, "rank": rank, **{p: f"{p}-{step}" for p in verdict.PIECES},
                **{p: f"{p}-{step}-rank{rank}-of-{world}" for p in verdict.PER_PROCESS}, **changed}

    def run(steps, world, changed=None):  # CHANGED: {(step, rank): {piece: value}}
        return {r: {s: row(s, r, world, **(changed or {}).get((s, r), {})) for s in steps} for r in range(world)}

    straight, stopped, killed = run(range(1, 9), 2), run(range(1, 5), 2), {0: 5, 1: 5}
    on_one = run(range(5, 9), 1)  # resumed after step 4, on 1 rank: only what each process has differs
    exact = verdict.judge(straight, stopped, on_one, killed, 4, other_world=True)
    assert exact["exact"] and exact["first"] is None
    assert exact["ranks"] == {"straight": 2, "resumed": 1}
    assert set(verdict.PER_PROCESS) <= set(exact["not_compared"])
    for piece in ("gradients", "lr", "optimizer", "params"):
        drifted = run(range(5, 9), 1, {(7, 0): {piece: "other"}})
        first = verdict.judge(straight, stopped, drifted, killed, 4, other_world=True)["first"]
        assert (first["step"], first["rank"], first["piece"]) == (7, 0, piece)
    # the same runs without --resume-command: rank 1 is missing from step 5 on, and rank 0's samples differ
    plain = verdict.judge(straight, stopped, on_one, killed, 4)
    assert not plain["exact"] and plain["first"] is not None
    assert (plain["first"]["step"], plain["first"]["rank"], plain["first"]["piece"]) == (5, 1, "missing")
    assert plain["first"]["pieces"][0][0] == "samples" and plain["ranks"] is None
    # another command on as many ranks is compared in every piece
    same_world = run(range(5, 9), 2, {(6, 1): {"samples": "other"}})
    found = verdict.judge(straight, stopped, same_world, killed, 4, other_world=True)
    assert (found["first"]["step"], found["first"]["rank"], found["first"]["piece"]) == (6, 1, "samples")


@pytest.mark.quick
def test_a_straight_run_is_reused_only_for_the_same_command_keeping_as_much_and_unchanged(tmp_path):
    """Catches: --straight-from taking another command's straight run, one that kept less than this run needs
    (no inputs for a repair), or one changed since certify wrote it; a reuse that does not bring the
    certificate and the straight run's time window (the shared-folder check reads it) along."""
    from certkit import outdir
    from certkit.errors import CannotJudge
    from certkit.runs import Runs

    source, command = tmp_path / "first", ["python", "train.py", "--out", "{run}"]
    (source / "straight").mkdir(parents=True)
    (source / "straight" / "rank0.jsonl").write_text('{"rank": 0, "step": 1, "params": "ab"}\n')
    (source / "straight.log").write_text("step 1\n")
    kept = {"CERTIFY_KEEP_RNG": "3", "CERTIFY_KEEP_FINAL": "1"}
    (source / "straight.json").write_text(json.dumps({"command": command, "settings": kept, "window": [5, 9],
                                                      "exit": 0}))
    outdir.record(source)

    def reuse(argv=command, **settings):
        out = tmp_path / f"out{len(list(tmp_path.iterdir()))}"
        out.mkdir()
        runs = Runs(out, 60, 3, argv)
        return runs, out, runs.reuse_straight(source, argv, **{"CERTIFY_KEEP_RNG": 3, "CERTIFY_KEEP_FINAL": 1,
                                                               **settings})

    runs, out, (code, rows, killed) = reuse()
    assert (code, rows, killed) == (0, {0: {1: {"rank": 0, "step": 1, "params": "ab"}}}, {})
    assert runs.windows["straight"] == (5, 9) and (out / "straight.log").read_text() == "step 1\n"
    for argv, settings, says in [
            (["python", "train.py", "--out", "{run}", "--steps", "8"], {}, "ran another command"),
            (command, {"CERTIFY_KEEP_INPUTS": 3}, "recorded with CERTIFY_KEEP_INPUTS=None, this one needs 3"),
            (command, {"CERTIFY_KEEP_RNG": 4}, "recorded with CERTIFY_KEEP_RNG=3, this one needs 4")]:
        with pytest.raises(CannotJudge, match="--straight-from .*" + says):
            reuse(argv, **settings)
    with open(source / "straight" / "rank0.jsonl", "a") as f:
        f.write("more\n")
    with pytest.raises(CannotJudge, match="rank0.jsonl was changed since certify wrote it"):
        reuse()
    (source / "straight.json").unlink()
    with pytest.raises(CannotJudge, match="no straight run a certify made there"):
        reuse()


NO_STEP = [sys.executable, "-c", "import torch; print(torch.ones(2).sum())"]


@pytest.mark.parametrize("case", ["no optimizer step", "stop after the last step", "resume fails",
                                  "command not found", "no checkpoint at step"])
def test_bad_input_is_one_line_and_exit_2_and_leaves_no_process(tmp_path, case):
    """Catches: a traceback, a verdict written where none could be judged, a process left running."""
    marker = f"--steps=7  # {tmp_path.name}"  # a word of the command line, to find its processes by
    command, stop, resume, says = {
        "no optimizer step": (NO_STEP, 2, "", "the command made no optimizer step"),
        "stop after the last step": ([*PLAIN, "--steps", "7"], 7, "--resume {run}/step_{step}.pt", "makes 7 optimizer steps"),
        "resume fails": ([*PLAIN, "--steps", "7"], 3, "--resume {run}/step_{step}.pt --forget everything",
                         "resume failed: plain_loop.py: error: argument --forget"),
        "command not found": (["no-such-trainer", "--out", "{run}"], 3, "", "command not found: no-such-trainer"),
        "no checkpoint at step": ([*PLAIN, "--steps", "7", "--save-every", "2"], 3, "--resume {run}/step_{step}.pt",
                                  "no checkpoint"),
    }[case]
    proc, verdict = certify(tmp_path / "out", stop, command, resume)
    lines = proc.stderr.splitlines()
    said = [i for i, line in enumerate(lines) if line.startswith("certify: ")]  # before it: progress, [certify] ...
    assert proc.returncode == 2 and len(said) == 1 and says in lines[said[0]], proc.stderr
    assert all(line.startswith("[certify] ") for line in lines[:said[0]]) and verdict is None
    assert not (tmp_path / "out" / "verdict.md").exists()
    processes = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert str(tmp_path / "out") not in processes and marker not in processes


# --- programs written as other people write them (tests/programs): what certify must get right on them -------

PROGRAMS = REPO / "tests" / "programs"


def rows_of(certificate) -> list:
    return [json.loads(line) for line in (certificate / "rank0.jsonl").read_text().splitlines()]


def test_a_process_that_looks_torch_up_before_importing_it_is_recorded(tmp_path):
    """Catches: a recorder that installs only when torch is imported first. `import transformers` (and
    datasets) call importlib.util.find_spec("torch") before the real import: a finder that gave up on that
    lookup left every Hugging Face-style script unrecorded ("the command made no optimizer step")."""
    script = ("import transformers\nimport torch\nnet = torch.nn.Linear(2, 1)\n"
              "opt = torch.optim.SGD(net.parameters(), lr=0.1)\nfor _ in range(3):\n"
              "    net(torch.ones(1, 2)).sum().backward(); opt.step(); opt.zero_grad()\n")
    env = {**ENV, "PYTHONPATH": str(SITE), "CERTIFY_RECORD": str(tmp_path / "c")}
    subprocess.run([sys.executable, "-c", script], env=env, check=True, capture_output=True, timeout=300)
    assert (tmp_path / "c" / "rank0.jsonl").exists(), "no certificate: the process ran unrecorded"
    assert [row["step"] for row in rows_of(tmp_path / "c")] == [1, 2, 3]


def test_a_forward_on_the_meta_device_runs_to_its_end_unrecorded_and_the_resume_is_exact(tmp_path):
    """Catches: a recorder that reads a meta tensor's bytes (the program dies: "Cannot copy out of meta tensor"),
    an error inside a hook raised into the program, or the FLOP counter's meta forward counted as a sample
    (the resumed run's first step would then differ from the straight run's in samples)."""
    command = [sys.executable, PROGRAMS / "litgpt_style.py", "--out_dir", "{run}", "--max_steps", "8"]
    proc, verdict = certify(tmp_path, 4, command, "--resume {run}/step-{step}/lit_model.pth")
    assert proc.returncode == 0 and verdict["exact"], proc.stderr[-2000:]
    assert "Measured TFLOPs" in (tmp_path / "straight.log").read_text()
    assert any("meta" in note for note in verdict["not_recorded"]["straight"])
    final = final_checkpoint(tmp_path, "final.pth")
    assert_same_state_dict(final["straight"], final["resumed"])


def test_weights_restored_from_fp16_are_named_the_parameters_the_step_starts_from(tmp_path):
    """Catches: a lossy weight restore named by its consequence (the gradients of step K + 1) because the
    parameters are digested only after the update; a recorder that does not read them before the step; a
    negative control called NOT caught (certify blind) where the resume already differs at K + 1, optimizer
    state included: it is inconclusive."""
    command = [sys.executable, PROGRAMS / "litgpt_style.py", "--out_dir", "{run}", "--max_steps", "6",
               "--save_dtype", "float16"]
    proc, verdict = certify(tmp_path, 3, command, "--resume {run}/step-{step}/lit_model.pth", "--control")
    assert proc.returncode == 1, proc.stderr[-2000:]
    first = verdict["first"]
    assert (first["step"], first["rank"], first["piece"]) == (4, 0, "params_in")
    # the resumed run's optimizer state differs at step 4 already: the control cannot show there, and says so
    control = verdict["control"]
    assert (control["outcome"], control["caught"]) == ("inconclusive", None), control
    assert "already differs at step 4" in control["why"] and not (tmp_path / "control.log").exists()
    said = (tmp_path / "verdict.md").read_text()
    assert "**inconclusive**" in said and "NOT caught" not in said + proc.stdout
    jsonschema.validate(verdict, json.loads((Path(SITE).parent / "verdict.schema.json").read_text()))
    # the file the resume read holds the weights as fp16 (the same script saving fp32 is exact: the test above)
    state = torch.load(tmp_path / "runs" / "resumed" / "step-3" / "lit_model.pth", weights_only=True)["model"]
    assert {v.dtype for v in state.values()} == {torch.float16}
    assert "samples" not in first["pieces"]["0"]


def test_an_auto_resume_from_a_checkpoint_older_than_k_names_its_real_start_and_the_steps_redone(tmp_path):
    """Catches: the resumed run's steps labelled from K when it resumed from an older checkpoint (its step 5
    compared with the straight run's step 6: not exact, samples), a real start not reported. The program
    saves every 2 steps and resumes by itself from its newest checkpoint: killed before step 6's update, its
    newest is step 4's (its own log says which file it resumed from)."""
    command = [sys.executable, PROGRAMS / "epochs_autoresume.py", "{run}", "--save_steps", "2"]
    proc, verdict = certify(tmp_path, 5, command)
    assert "resumed from" in (tmp_path / "resumed.log").read_text()
    assert (tmp_path / "resumed.log").read_text().strip().endswith("ckpt_4.pt")
    assert proc.returncode == 0 and verdict["exact"], proc.stderr[-2000:]
    assert verdict["resumed_from"] == 4 and verdict["steps"]["resumed"] == {"0": [5, 12]}
    assert [r["step"] for r in rows_of(tmp_path / "resumed")] == list(range(6, 14))  # as recorded, from K
    assert "resumed from step 4's state, not 5's: 1 step redone" in proc.stdout
    final = final_checkpoint(tmp_path, "model_final.pt")
    assert_same_state_dict(final["straight"], final["resumed"])


def test_an_rng_draw_nothing_uses_is_a_warning_not_a_difference_and_the_control_beside_it_is_caught(tmp_path):
    """Catches: "not exact" when nothing that was trained differs (the headline contradicting max |Δw| = 0),
    and a negative control masked by that RNG difference coming first in causal order. The program's
    DataLoader draws each epoch's base seed from the global RNG, which its resume does not restore: resumed
    at an epoch's end, the straight run has drawn twice by step 5, the resumed run once."""
    command = [sys.executable, PROGRAMS / "epochs_autoresume.py", "{run}"]
    proc, verdict = certify(tmp_path, 4, command, "", "--control")
    assert proc.returncode == 0 and verdict["exact"] and verdict["max_abs_dw"] == 0.0, proc.stderr[-2000:]
    warning = verdict["rng_warning"]
    assert warning["step"] == 5 and warning["pieces"]["0"] == ["rng_torch"]
    assert "Warning: from step 5" in (tmp_path / "verdict.md").read_text()
    final = final_checkpoint(tmp_path, "model_final.pt")
    assert_same_state_dict(final["straight"], final["resumed"])
    control = verdict["control"]
    assert control["caught"] and control["first"]["step"] == 5
    assert control["first"]["pieces"]["0"] == ["rng_torch", "optimizer", "params"]


def test_runs_that_share_a_checkpoint_folder_are_refused_naming_the_file(tmp_path):
    """Catches: a verdict of exact for a command whose runs share ./checkpoints: the stopped run is killed
    before its thread writes step 4's file, so the resumed run reads the straight run's, and certify would
    compare the straight run with itself. One lane: with the straight run beside it, the stopped run may also
    find no step 4 file at all, which certify refuses too (checked last, on any message)."""
    work = tmp_path / "work"
    work.mkdir()
    command = [sys.executable, PROGRAMS / "fixed_folder_thread_save.py"]
    proc, verdict = certify(tmp_path / "out", 4, command, "--resume checkpoints/ckpt_{step}.pt", "--jobs", "1",
                            cwd=work)
    lines = proc.stderr.splitlines()
    assert proc.returncode == 2 and verdict is None, proc.stderr[-2000:]
    refusal = next(line for line in lines if line.startswith("certify: "))
    assert str(work / "checkpoints" / "ckpt_4.pt") in refusal and "straight run wrote" in refusal
    shutil.rmtree(work / "checkpoints")
    proc, verdict = certify(tmp_path / "lanes", 4, command, "--resume checkpoints/ckpt_{step}.pt", "--jobs", "2",
                            cwd=work)
    assert proc.returncode == 2 and verdict is None, proc.stderr[-2000:]


def test_an_auto_resume_from_a_fixed_folder_is_refused_naming_the_straight_runs_checkpoint(tmp_path):
    """Catches: a rule that lets a run read another run's checkpoint (the program resumes by itself from the
    newest file in ./checkpoints: the stopped run would continue the straight run's training from its last
    step), or one that names no file. One lane: beside it, which run reads which file first is a race."""
    work = tmp_path / "work"
    work.mkdir()
    proc, verdict = certify(tmp_path / "out", 4, [sys.executable, PROGRAMS / "epochs_autoresume.py", "checkpoints"],
                            "", "--jobs", "1", cwd=work)
    refusal = next(line for line in proc.stderr.splitlines() if line.startswith("certify: "))
    assert proc.returncode == 2 and verdict is None, proc.stderr[-2000:]
    assert f"the stopped run read {work / 'checkpoints' / 'ckpt_12.pt'}" in refusal
    assert "after its first optimizer step" in refusal


@pytest.mark.parametrize("program", ["datasets_map", "prepare_beside"])
def test_data_every_run_prepares_before_training_is_no_shared_checkpoint(tmp_path, program):
    """Catches: a refusal (exit 2) of a sound command whose runs share what they prepared before training:
    datasets' Arrow files and locks in a cache_dir named without "cache" (/scratch/hf_datasets), fresh at the
    start, and a tokenized train.bin that a nanoGPT-style script writes beside itself on its first run. Each
    program resumes exactly; its final weights, written by two processes, are compared tensor by tensor."""
    work = tmp_path / "work"
    work.mkdir()
    if program == "datasets_map":
        (work / "train.jsonl").write_text("".join(json.dumps({"text": f"line {i}: the cat sat on mat {i * 7}"}) + "\n"
                                                  for i in range(32)))
        command = [sys.executable, PROGRAMS / "datasets_map.py", "--train_file", work / "train.jsonl",
                   "--cache_dir", work / "hf_datasets", "--output_dir", "{run}"]
        resume, shared = "--resume_from_checkpoint {run}/step_{step}.pt", work / "hf_datasets"
    else:
        shutil.copy(PROGRAMS / "prepare_beside.py", work)
        command, resume = [sys.executable, work / "prepare_beside.py", "--out_dir", "{run}"], "--resume {run}/ckpt_{step}.pt"
        shared = work / "train.bin"
    assert "cache" not in str(shared).lower()  # the name rule does not pass it
    proc, verdict = certify(tmp_path / "out", 4, command, resume, cwd=work)
    assert proc.returncode == 0 and verdict["exact"] and verdict["diagnosis"] is None, proc.stderr[-2000:]
    reads = "".join(p.read_text() for p in (tmp_path / "out" / "resumed").glob("reads.*.txt"))
    assert str(shared) in reads  # the resumed run did read what the straight run prepared
    final = final_checkpoint(tmp_path / "out", "final.pt")
    assert_same_state_dict(final["straight"], final["resumed"])


@pytest.mark.quick
def test_a_read_is_shared_when_written_after_the_first_step_outside_a_cache(tmp_path):
    """Catches: a rule that refuses a file written before the straight run's first optimizer step (a
    preprocessing product), passes one written after it, or ignores a cache a variable names
    (HF_DATASETS_CACHE=/scratch/hf_datasets, where a Trainer's evaluation may map a dataset mid-training)."""
    from certkit.runs import shared_read, training_began

    rows = {0: {1: {"time_ns": 500}, 2: {"time_ns": 600}}, 1: {1: {"time_ns": 450}}}
    began = training_began(rows, 100)
    assert began == 450 and training_began({0: {1: {"step": 1}}}, 100) == 100  # rows without a time: the start
    reads = "\n".join(["300\t/scratch/hf_datasets/lock", "449\t/work/train.bin", "700\t/scratch/hf_datasets/x.arrow",
                       "900\t/work/out/ckpt_2.pt", "2000\t/work/after.pt"])
    assert shared_read(reads, began, 1000, env={}) == "/scratch/hf_datasets/x.arrow"
    assert shared_read(reads, began, 1000, env={"HF_DATASETS_CACHE": "/scratch/hf_datasets"}) == "/work/out/ckpt_2.pt"
    assert shared_read(reads, began, 800, env={"HF_DATASETS_CACHE": "/scratch/hf_datasets"}) is None
    assert shared_read("450\t/home/u/.cache/x.pt", began, 1000, env={}) is None
    # beside a straight run (two lanes) the stopped run's checkpoint is written in the same window: what the
    # reading run's own chain wrote (a path, or its folder) passes; a folder is matched as a folder, not a prefix
    hf = {"HF_DATASETS_CACHE": "/scratch/hf_datasets"}
    assert shared_read(reads, began, 1000, env=hf, own={"/work/out/ckpt_2.pt"}) is None
    assert shared_read(reads, began, 1000, env=hf, own={"/work/out/"}) is None
    assert shared_read("900\t/work/out", began, 1000, env=hf, own={"/work/out/"}) is None  # opened to fsync it
    assert shared_read(reads, began, 1000, env=hf, own={"/work/ou/", "/work/out"}) == "/work/out/ckpt_2.pt"


@pytest.mark.slow
def test_run_py_saves_survive_a_crash_at_every_file_event_and_every_power_loss_state(tmp_path):
    """certify --crash on run.py's auto-resume from its checkpoint folder (checkpoints every 2 steps; saves 2
    and 4 recorded, the kill before step 5). run.py writes each file to a .tmp, fsyncs it, renames it and
    fsyncs the folder, and picks only sealed checkpoints: no state of either failure model may fail.
    Catches: a save path that renames before its fsync, an auto-resume that takes an unsealed folder, and a
    crash mode that resumes nothing (every state of both models counted, a dozen resumed)."""
    cfg = tmp_path / "config.yaml"
    cfg.write_text(yaml.safe_dump(tiny_config(steps=6, checkpoint={"every": 2, "keep": 2, "keep_when_done": False,
                                                                   "async": False})))
    tokens = tmp_path / "train.npy"
    np.save(tokens, np.random.default_rng(0).integers(0, 512, 4096, dtype=np.uint16))
    out = tmp_path / "crash"
    proc = subprocess.run([*CERTIFY, "--crash", "--max-points", "12", "--out", out, "--stop-after", "4", "--",
                           sys.executable, REPO / "workflow" / "scripts" / "run.py", "--config", cfg, "--tokens", tokens,
                           "--out", "{run}/weights.pth", "--checkpoint-dir", "{run}/checkpoints"],
                          capture_output=True, text=True, env=ENV, timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    found = json.loads((out / "crash.json").read_text())
    assert found["checkpoints"] == [2, 4] and found["resumed"] == 12, found["counts"]
    for model in ("process crash", "power loss"):
        assert found["counts"][model]["exact"] > 0 and sum(found["counts"][model].values()) > 0, found["counts"]


def test_verdicts_are_the_same_field_for_field_in_one_lane_or_two(tmp_path):
    """The straight run beside the stopped and resumed runs (--jobs 2), or after them (--jobs 1): the same
    verdict.json, every field, for an exact resume and for one ended at its first difference. Catches: a
    verdict that depends on when the runs were ended (its last step, the steps, max |Δw|), a lane's check made
    in another order, a stopped run's checkpoint taken for the straight run's (written in its window)."""
    found = {}
    for resume in ("--resume {run}/step_{step}.pt", "--resume {run}/step_{step}.pt --forget generator"):
        for jobs in ("1", "2"):
            out = tmp_path / f"{len(resume)}-{jobs}"
            proc, found[resume, jobs] = certify(out, 5, [*PLAIN, "--steps", "12"], resume, "--jobs", jobs)
            assert proc.returncode in (0, 1) and found[resume, jobs], proc.stderr[-2000:]
            lanes = "two lanes" if jobs == "2" else "one lane"
            assert f"[certify] {lanes}: " in proc.stderr, proc.stderr[-2000:]
            if "forget" not in resume:  # compared as they go: the steps after K, said equal as they come
                assert "12: equal so far" in proc.stderr, proc.stderr[-2000:]
        assert found[resume, "1"] == found[resume, "2"], resume
    exact, parted = (found[r, "2"] for r in ("--resume {run}/step_{step}.pt",
                                              "--resume {run}/step_{step}.pt --forget generator"))
    assert exact["exact"] and exact["ended_early"] is None and exact["max_abs_dw"] == 0.0
    assert (parted["first"]["step"], parted["first"]["piece"]) == (6, "samples")
    assert (parted["ended_early"] or {}).get("step") == 6 and parted["max_abs_dw"] is None
    assert parted["last_step"] == 6 and parted["steps"]["straight"] == {"0": [1, 6]}


def certify_processes(out) -> list:
    """The pids of processes whose environment names a certificate folder under OUT (/proc: any session)."""
    marker = f"CERTIFY_RECORD={out}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and marker in (entry / "environ").read_bytes():
                found.append(int(entry.name))
        except OSError:
            continue
    return found


@pytest.mark.slow  # its witness: test_the_stream_says_the_first_difference_and_ends_the_runs_once_its_cause_is_known
def test_runs_ended_at_the_first_difference_leave_no_process_and_name_what_a_full_run_names(tmp_path):
    """A long resume that forgets its generator: by default certify ends the runs once every rank has parted
    (the resumed run is "stopped by certify" long before its 400 steps), and says each comparison as it goes;
    --full runs both to the end. Catches: an early end that leaves a run's process behind (checked in /proc,
    in every session), a verdict that names another step, rank or piece than the full run's, a max |Δw|
    reported for runs that were not finished, and no "equal so far" progress."""
    command = [*PLAIN, "--steps", "400", "--save-every", "5"]
    resume = "--resume {run}/step_{step}.pt --forget generator"
    proc, early = certify(tmp_path / "early", 10, command, resume)
    assert proc.returncode == 1 and early, proc.stderr[-2000:]
    assert certify_processes(tmp_path / "early") == []
    assert "stopped by certify" in proc.stderr
    assert "[certify] step 11: samples (what the model received) differ at rank 0" in proc.stderr, proc.stderr[-2000:]
    resumed = [json.loads(line) for line in (tmp_path / "early" / "resumed" / "rank0.jsonl").open()]
    assert len(resumed) < 390, "the resumed run went on to its end"
    proc, full = certify(tmp_path / "full", 10, command, resume, "--full")
    assert proc.returncode == 1 and full["ended_early"] is None and full["max_abs_dw"] > 0, proc.stderr[-2000:]
    assert full["steps"]["resumed"] == {"0": [11, 400]}
    assert [early["first"][k] for k in ("step", "rank", "piece")] == [full["first"][k] for k in ("step", "rank", "piece")]
    assert early["first_by_rank"] == full["first_by_rank"]
    # the same cause, named from step 11 alone (the full run's evidence spans every step after it)
    assert [(c["class"], c["where"], c.get("how"), c.get("from_step")) for c in early["diagnosis"]["causes"]] == \
        [(c["class"], c["where"], c.get("how"), c.get("from_step")) for c in full["diagnosis"]["causes"]]
    assert early["max_abs_dw"] is None and "not measured" in early["ended_early"]["why"]
    schema = json.loads((Path(SITE).parent / "verdict.schema.json").read_text())
    jsonschema.validate(early, schema)
    with pytest.raises(jsonschema.ValidationError):  # the schema says what ended_early holds
        jsonschema.validate({**early, "ended_early": {"step": "11"}}, schema)
    assert "not measured" in (tmp_path / "early" / "verdict.md").read_text()


@pytest.mark.quick
def test_the_default_lanes_follow_the_cpus_the_threads_a_gpu_and_launchers(monkeypatch):
    """Catches: two lanes where a run takes every CPU (torch's default threads), on a GPU two runs would
    share, or for a launcher that may claim a fixed port (torchrun's 29500)."""
    from certkit import lanes

    monkeypatch.setattr(lanes, "gpu_visible", lambda env=None: False)
    python = ["python", "train.py"]
    assert lanes.default_jobs(python, {"OMP_NUM_THREADS": "1"}, cpus=2)[0] == 2
    assert lanes.default_jobs(python, {"OMP_NUM_THREADS": "2"}, cpus=2)[0] == 1
    assert lanes.default_jobs(python, {}, cpus=2)[0] == 1  # torch's default: a thread per CPU
    assert lanes.default_jobs(python, {"OMP_NUM_THREADS": "1"}, cpus=16)[0] == 2  # two lanes at most
    assert lanes.default_jobs(["/usr/bin/torchrun", "--nproc-per-node", "2", "t.py"], {"OMP_NUM_THREADS": "1"},
                              cpus=16)[0] == 1
    assert lanes.default_jobs(["python", "-m", "torch.distributed.run", "t.py"], {"OMP_NUM_THREADS": "1"},
                              cpus=16)[0] == 1
    monkeypatch.setattr(lanes, "gpu_visible", lambda env=None: True)
    jobs, why = lanes.default_jobs(python, {"OMP_NUM_THREADS": "1"}, cpus=16)
    assert jobs == 1 and "GPU" in why


@pytest.mark.quick
def test_a_certificate_read_as_it_is_written_takes_whole_lines_once(tmp_path):
    """Catches: a line the recorder is still writing taken for a row (or dropped, its end never read), a row
    read twice across looks, a line that is not a JSON object raised into certify's stream."""
    from certkit import lanes

    folder = tmp_path / "straight"
    folder.mkdir()
    path = folder / "rank0.jsonl"
    path.write_text('{"rank": 0, "step": 1}\n{"rank": 0, "st')
    tail = lanes.Tail(folder)
    assert tail.read() == ({0: {1: {"rank": 0, "step": 1}}}, {})
    with path.open("a") as f:
        f.write('ep": 2}\nnot json\n[3]\n{"rank": 0, "killed": 2}\n')
    rows, killed = tail.read()
    assert sorted(rows[0]) == [1, 2] and killed == {0: 2}
    assert tail.read() == ({0: {1: {"rank": 0, "step": 1}, 2: {"rank": 0, "step": 2}}}, {0: 2})


def fake_rows(steps, samples) -> list:
    """Rank 0's certificate rows of STEPS, each step's samples SAMPLES(step), its parameters a chain (the
    step starts from the step before's): runs that differ only in what they were fed."""
    return [{"rank": 0, "step": s, "samples": samples(s), "params_in": f"p{s - 1}", "params": f"p{s}", "lr": [0.1]}
            for s in steps]


@pytest.mark.quick
def test_the_runs_end_early_only_once_the_steps_so_far_name_a_cause(tmp_path):
    """Catches: runs ended at the first difference when the cause shows only in later steps (samples skipped
    ahead are the straight run's later samples: cut there, the diagnosis is unknown), and early ending lost
    where the steps so far name it (samples replayed from an earlier step). In-process, on rows made here."""
    from certkit import lanes

    def rows(steps, samples):
        return {0: {row["step"]: row for row in fake_rows(steps, samples)}}

    straight, stopped = rows(range(1, 9), "s{}".format), rows(range(1, 5), "s{}".format)  # killed before step 5
    ahead, behind = rows(range(5, 9), lambda s: f"s{s + 2}"), rows(range(5, 9), lambda s: f"s{s - 2}")
    assert lanes.early_end(straight, stopped, {0: 5}, ahead, 4, 5, 4, tmp_path) is None
    assert lanes.early_end(straight, stopped, {0: 5}, behind, 4, 5, 4, tmp_path) == 5
    # the straight run not yet past the kill: the stopped run's steps may still differ from it
    assert lanes.early_end(rows(range(1, 4), "s{}".format), stopped, {0: 5}, behind, 4, 5, 4, tmp_path) is None


@pytest.mark.quick
def test_the_stream_says_the_first_difference_and_ends_the_runs_once_its_cause_is_known(tmp_path):
    """Catches: runs not told to end at the first difference (a verdict that costs the whole run), told to end
    where the steps so far name no cause, or told to without early ending asked for (--full); and a first
    difference not said as it shows. In-process: certificates written here, one look each (the slow witness,
    test_runs_ended_at_the_first_difference_leave_no_process_and_name_what_a_full_run_names, ends real runs)."""
    import io
    import threading

    from certkit import lanes

    def certificate(folder, steps, samples, killed=None):
        folder.mkdir(parents=True)
        lines = fake_rows(steps, samples) + ([{"rank": 0, "killed": killed}] if killed else [])
        (folder / "rank0.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))

    for name, samples, early, ends in (("replayed", lambda s: f"s{s - 2}", True, True),
                                       ("ahead", lambda s: f"s{s + 2}", True, False),
                                       ("full", lambda s: f"s{s - 2}", False, False)):
        out = tmp_path / name
        certificate(out / "straight", range(1, 9), "s{}".format)
        certificate(out / "stopped", range(1, 5), "s{}".format, killed=5)  # K = 4
        certificate(out / "resumed", range(5, 9), samples)
        stop, said = threading.Event(), io.StringIO()
        stream = lanes.Stream(out, 4, 5, stop, early, said)
        looks = [stream.look() for _ in range(lanes.EARLY_TRIES + 1)]
        assert (any(looks), stop.is_set()) == (ends, ends), name
        assert "step 5: samples (what the model received) differ at rank 0" in said.getvalue(), said.getvalue()

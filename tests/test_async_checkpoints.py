"""checkpoint.async: the checkpoint written in the background from a snapshot while training goes on, and
checkpoint.every: auto, the interval chosen from the measured step time and save stall.

Each run is a real process, compared bit for bit with the uninterrupted run of test_preemption.
"""

import io
import re
import signal
import subprocess

import pytest
import torch
from conftest import clean_env, same_state_dict
from test_preemption import (DDP_ENV, EVERY, STEPS, assert_same_as_uninterrupted, chaos_config, committed, ddp_cmd,
                             ddp_job, killed_after_step, newest_checkpoint, resumed_step, run,
                             signal_torchrun_after_step, train_cmd, uninterrupted)

from mmkit.checkpoint.files import host_snapshot
from mmkit.model import MiniMindForCausalLM, ModelConfig

__all__ = ["ddp_job", "uninterrupted"]  # fixtures of test_preemption, used here


def saved_bytes(obj) -> bytes:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


def test_a_snapshot_saves_as_its_source_did_and_training_no_longer_changes_it():
    """Catches: a snapshot that holds the live tensors (the background write would save a later step's
    values), one that unties the tied embedding or drops a state_dict's _metadata (a file of other bytes),
    a refilled snapshot that keeps stale values."""
    model = MiniMindForCausalLM(ModelConfig(hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                            num_key_value_heads=1, vocab_size=32))
    state = {"model": model.state_dict(), "step": 3, "log": [(1, 0.5)]}
    assert state["model"]["lm_head.weight"].data_ptr() == state["model"]["model.embed_tokens.weight"].data_ptr()
    before = saved_bytes(state)
    snapshot = host_snapshot(state)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)  # the next optimizer step, in place
    assert saved_bytes(snapshot) == before
    assert not same_state_dict(snapshot["model"], model.state_dict())
    # the next checkpoint's snapshot refills the last one's storages, and saves as its own source does
    buffers = []
    host_snapshot(state, reuse=buffers)
    first = [b.data_ptr() for b in buffers]
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(0.5)
    again = host_snapshot(state, reuse=buffers)
    assert [b.data_ptr() for b in buffers] == first and saved_bytes(again) == saved_bytes(state)


def test_a_background_save_writes_the_bytes_of_a_foreground_save(pipeline, uninterrupted, tmp_path):
    """Catches: a background checkpoint of other bytes than the synchronous one (a snapshot taken late, a
    tensor copied twice), one missing or left uncommitted, a final output written before the last commit."""
    folders, logs = {}, {}
    for mode in ("sync", "async"):
        config = chaos_config(pipeline, tmp_path, f"{mode}.yaml", keep=STEPS, keep_when_done=True,
                              **{"async": mode == "async"})
        out, folders[mode] = tmp_path / f"{mode}.pth", tmp_path / f"ck-{mode}"
        proc = run(train_cmd(config, pipeline, out, folders[mode]))
        assert proc.returncode == 0, proc.stderr[-1500:]
        logs[mode] = proc.stderr
        assert_same_as_uninterrupted(out, uninterrupted)
    names = [f"step_{s:06d}.pth" for s in range(EVERY, STEPS, EVERY)]
    assert [p.name for p in committed(folders["sync"])] == names
    assert sorted(p.name for p in folders["async"].glob("step_*")) == names  # every one committed, no .tmp left
    assert logs["async"].count("(writing in the background)") == len(names)
    assert "(writing in the background)" not in logs["sync"]
    differing = [n for n in names if (folders["sync"] / n).read_bytes() != (folders["async"] / n).read_bytes()]
    assert differing == []


def test_a_kill_during_a_background_write_leaves_the_previous_checkpoint(pipeline, uninterrupted, tmp_path):
    """Catches: a background write that commits a torn file, or damages or removes the checkpoint before it."""
    out, checkpoints = tmp_path / "job.pth", tmp_path / "checkpoints"
    cmd = train_cmd(chaos_config(pipeline, tmp_path, **{"async": True}), pipeline, out, checkpoints)
    # after step 2 * EVERY + 1: step EVERY's write is committed by then (step 2 * EVERY's snapshot waited for
    # it), 2 * EVERY's may still be in flight
    code, err = killed_after_step(cmd, 2 * EVERY + 1, signal.SIGKILL)
    assert code == -signal.SIGKILL and committed(checkpoints), err[-1500:]
    before = {p.name: p.read_bytes() for p in committed(checkpoints)}
    # killed inside the first save of the restart, in the writer thread: its bytes written, nothing renamed
    proc = run(cmd, {**clean_env(), "MMKIT_FAILPOINT": "save:0"})
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-1500:]
    assert resumed_step(proc.stderr) == newest_checkpoint(checkpoints)
    assert {p.name: p.read_bytes() for p in committed(checkpoints)} == before
    assert [p.name for p in checkpoints.glob("*.tmp")], "the killed write left no .tmp: was it killed inside it?"
    proc = run(cmd)
    assert proc.returncode == 0, proc.stderr[-1500:]
    assert resumed_step(proc.stderr) == max(int(n[5:11]) for n in before)
    assert_same_as_uninterrupted(out, uninterrupted)


@pytest.mark.parametrize("ranks", [1, 2], ids=["one-process", "ddp"])
def test_a_signal_under_async_ends_in_a_committed_checkpoint_and_exit_75(pipeline, uninterrupted, ddp_job, tmp_path,
                                                                        ranks):
    """Catches: a preempted job that exits while its checkpoint is still being written (or leaves it
    uncommitted), a background write that rank 0 alone waits for, a continuation that is not bit-exact."""
    out, checkpoints = tmp_path / "job.pth", tmp_path / "checkpoints"
    if ranks == 1:
        cmd, env, ref = train_cmd(chaos_config(pipeline, tmp_path, **{"async": True}), pipeline, out, checkpoints), \
            clean_env(), uninterrupted
    else:
        config = tmp_path / "ddp-async.yaml"
        config.write_text(ddp_job[0].read_text().replace("async: false", "async: true"))
        cmd, env, ref = ddp_cmd(config, pipeline, out, checkpoints), DDP_ENV, ddp_job[1]
    code, err = (killed_after_step(cmd, 2 * EVERY + 1, signal.SIGTERM, env) if ranks == 1 else
                 signal_torchrun_after_step(cmd, 2 * EVERY + 1, signal.SIGTERM, env))
    assert code == 75 and "preempted: SIGTERM after step" in err, err[-2000:]
    assert "(writing in the background)" in err  # the periodic ones before it were
    stopped = newest_checkpoint(checkpoints)
    assert stopped >= 2 * EVERY + 1 and not list(checkpoints.glob("*.tmp"))
    assert torch.load(committed(checkpoints)[-1], weights_only=True)["step"] == stopped
    proc = run(cmd, env) if ranks == 1 else subprocess.run(cmd, capture_output=True, text=True, env=env)
    assert proc.returncode == 0 and resumed_step(proc.stderr) == stopped, proc.stderr[-2000:]
    assert_same_as_uninterrupted(out, ref)


def test_every_auto_checkpoints_as_the_measured_costs_allow_and_changes_no_bit(pipeline, uninterrupted, tmp_path):
    """Catches: an auto interval that never checkpoints, checkpoints sooner than it says, or changes the
    result (a checkpoint must change no bit)."""
    out, checkpoints = tmp_path / "job.pth", tmp_path / "checkpoints"
    # a large budget, so that a tiny model's stall (about one step) still allows several checkpoints
    config = chaos_config(pipeline, tmp_path, every="auto", overhead=0.5, keep=STEPS, keep_when_done=True,
                          **{"async": True})
    proc = run(train_cmd(config, pipeline, out, checkpoints))
    assert proc.returncode == 0, proc.stderr[-1500:]
    assert_same_as_uninterrupted(out, uninterrupted)
    # the log's order: each checkpoint, then the interval chosen from its stall
    events = re.findall(r"^checkpoint: (?:\S+/step_(\d+)\.pth|every auto = (\d+) steps)", proc.stderr, re.M)
    saved = [int(s) for s, _ in events if s]
    assert saved and saved[0] == 2, events  # after the second step: its first step warms up
    assert [p.name for p in committed(checkpoints)] == [f"step_{s:06d}.pth" for s in saved]
    # never sooner than the interval said; later only while the last write's cost is still being measured
    interval, last = None, None
    for step, every in events:
        if every:
            interval = int(every)
        elif last is not None:
            assert interval is not None and int(step) - last >= interval, events
        last = int(step) if step else last
    assert len(saved) >= 3, events
    assert all(torch.load(checkpoints / f"step_{s:06d}.pth", weights_only=True)["step"] == s for s in saved[:3])

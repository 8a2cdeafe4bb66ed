"""The audit of other trainers' resume: what every adapter shares, so that an adapter is only its framework's calls.

One tiny LLaMA-family model (this project's MiniMind2), one dataset of token windows that each carry their id, one
cosine over STEPS, the scenarios, and the per-step certificate: after every optimizer step, the sample ids it
trained on, its LR, the three global RNGs, AdamW's state and the weights, each as a digest. Two certificates
compared name the first step and the first piece of state that differ; the pieces are in cause order (what a
step reads before what it writes), so the first one named is the cause, not a consequence.
"""

import hashlib
import importlib.metadata
import json
import math
import os
import random
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from .atomic import write_text_atomic
from .errors import UserError
from .model import MiniMindForCausalLM, ModelConfig

STEPS = 12  # optimizer steps of every run: an epoch is 8 batches, so 1.5 epochs (6 with accumulation 4)
SAMPLES = 32  # windows in the dataset
BATCH_SIZE = 4
SEQ_LEN = 32
LR = 1e-3
WEIGHT_DECAY = 0.01
GRAD_CLIP = 1.0
BATCHES_PER_EPOCH = SAMPLES // BATCH_SIZE


@dataclass(frozen=True)
class Scenario:
    cut: int  # the framework's checkpoint at this optimizer step; the stopped run ends right after it
    what: str
    workers: int = 0
    dropout: float = 0.0
    accumulation: int = 1
    precision: str = "fp32"  # fp32 | bf16 (autocast) | fp16 (autocast and a GradScaler)


SCENARIOS = {
    "mid_epoch": Scenario(3, "a cut in the middle of the first epoch, shuffled"),
    "second_epoch": Scenario(BATCHES_PER_EPOCH + 3, "the cut in the second epoch"),
    "epoch_end": Scenario(BATCHES_PER_EPOCH, "the cut exactly at the first epoch's end"),
    "workers2": Scenario(3, "DataLoader workers 2", workers=2),
    "dropout": Scenario(3, "dropout 0.1 (attention)", dropout=0.1),
    "accumulation4": Scenario(5, "gradient accumulation 4, cut mid-epoch", accumulation=4),
    "bf16": Scenario(3, "bf16 autocast", precision="bf16"),
    "fp16": Scenario(3, "fp16 autocast with a GradScaler", precision="fp16"),
}

# the rows, and the package each needs (None: this project's own loop, nothing to install)
PACKAGES = {"own": None, "transformers": "transformers", "accelerate": "accelerate", "lightning": "lightning",
            "lightning_stateful": "lightning"}


def adapter_of(row: str) -> tuple[str, list]:
    """(the framework whose adapter runs ROW, the flags that choose ROW's recipe): a row FRAMEWORK_RECIPE is the
    framework's recipe with the fix it needs from its user (lightning_stateful: --recipe stateful)."""
    framework, _, recipe = row.partition("_")
    return framework, ["--recipe", recipe] if recipe else []

# the certificate's pieces in cause order, and what a difference in each means
PIECES = {
    "samples": "the data position (other sample ids)",
    "lr": "the LR schedule",
    "rng_torch": "the torch RNG (dropout stream)",
    "rng_numpy": "the numpy RNG",
    "rng_python": "Python's random",
    "optimizer": "the optimizer state",
    "params": "the weights",
}


# what a repair run restores by hand for each piece the certificate can name first
REPAIR_OF = {"samples": "samples", "rng_torch": "rng", "rng_numpy": "rng", "rng_python": "rng"}


def version(framework: str) -> str:
    package = PACKAGES[framework]
    return importlib.metadata.version(package) if package else "-"


def require(framework: str) -> None:
    """One line naming the package and its install command when a framework is not installed."""
    package = PACKAGES[framework]
    if package is None:
        return
    try:
        importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        raise UserError(f"audit framework {framework} needs the package {package}: "
                        f"pip install -r requirements.txt (or pip install {package})") from None


# --- the model and the data ---------------------------------------------------------------------


class AuditLM(torch.nn.Module):
    """This project's MiniMind2 at a tiny size, called the way trainers call a model: model(**batch) returns a
    dict with the loss. The head is untied: Trainer saves a plain module with safetensors, which refuses
    shared tensors."""

    def __init__(self, dropout: float, vocab_size: int):
        super().__init__()
        cfg = ModelConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                          vocab_size=vocab_size, max_position_embeddings=SEQ_LEN, dropout=dropout)
        self.lm = MiniMindForCausalLM(cfg)
        self.lm.lm_head.weight = torch.nn.Parameter(self.lm.lm_head.weight.detach().clone())

    def forward(self, input_ids, labels=None, **_):
        # next-token targets: the window shifted by one, the last position predicting nothing
        targets = None if labels is None else torch.nn.functional.pad(labels[:, 1:], (0, 1), value=-100)
        logits, loss = self.lm(input_ids, targets)
        return {"loss": loss, "logits": logits}


def build_model(scenario: Scenario, vocab_size: int, seed: int) -> AuditLM:
    """The model, built after seeding all three global RNGs: every run of a cell draws the same initial
    weights, and the certificate compares RNG states that a seed set (the frameworks seed them too)."""
    torch.manual_seed(seed)
    np.random.seed(seed)
    random.seed(seed)
    return AuditLM(scenario.dropout, vocab_size)


class Windows(torch.utils.data.Dataset):
    """SAMPLES consecutive windows of the training tokens; each item carries its id, so a step can say which
    samples it trained on."""

    def __init__(self, tokens: np.ndarray, replay=None):
        need = SAMPLES * SEQ_LEN
        if len(tokens) < need:
            raise UserError(f"the audit needs {need} training tokens, the token file has {len(tokens)}")
        self.windows = torch.from_numpy(np.asarray(tokens[:need], dtype=np.int64)).view(SAMPLES, SEQ_LEN)
        # the data-position repair: the n-th item read is the n-th the straight run read after the cut, whatever
        # index the framework's sampler asks for (counted in this process: not through DataLoader workers)
        self.replay = None if replay is None else iter(replay)

    def __len__(self):
        return SAMPLES

    def __getitem__(self, i):
        i = i if self.replay is None else next(self.replay)
        return {"input_ids": self.windows[i], "labels": self.windows[i], "idx": i}


def collate(items: list) -> dict:
    return {"input_ids": torch.stack([it["input_ids"] for it in items]),
            "labels": torch.stack([it["labels"] for it in items]),
            "idx": torch.tensor([it["idx"] for it in items])}


def cosine(step: int) -> float:
    """The LR factor after STEP optimizer steps (0-based, as LambdaLR counts): a cosine over STEPS."""
    return 0.5 * (1 + math.cos(math.pi * step / STEPS))


# --- the certificate ------------------------------------------------------------------------------


def _sha(*chunks: bytes) -> str:
    h = hashlib.sha256()
    for c in chunks:
        h.update(c)
    return h.hexdigest()[:16]


def _tensor_bytes(t: torch.Tensor) -> bytes:
    t = t.detach().cpu().contiguous()
    return f"{t.dtype}{list(t.shape)}".encode() + t.reshape(-1).view(torch.uint8).numpy().tobytes()


def params_digest(model) -> str:
    return _sha(*(name.encode() + _tensor_bytes(p) for name, p in sorted(model.named_parameters())))


def optimizer_digest(optimizer) -> str:
    sd = optimizer.state_dict()
    chunks = []
    for index in sorted(sd["state"]):
        for key, value in sorted(sd["state"][index].items()):
            chunks.append(f"{index}.{key}".encode())
            chunks.append(_tensor_bytes(value) if isinstance(value, torch.Tensor) else repr(value).encode())
    for group in sd["param_groups"]:  # the hyperparameters; lr is a piece of its own
        chunks.append(repr(sorted((k, v) for k, v in group.items() if k not in ("params", "lr"))).encode())
    return _sha(*chunks)


def rng_states() -> dict:
    """The three global RNGs, as plain data a weights_only load reads back."""
    name, keys, pos, has_gauss, cached = np.random.get_state()
    version, internal, gauss = random.getstate()
    return {"torch": torch.get_rng_state(),
            "numpy": (name, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, cached),
            "python": (version, list(internal), gauss)}


def set_rng_states(states: dict) -> None:
    torch.set_rng_state(states["torch"])
    name, keys, pos, has_gauss, cached = states["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    version, internal, gauss = states["python"]
    random.setstate((version, tuple(internal), gauss))


def rng_digests() -> dict:
    s = rng_states()
    return {"rng_torch": _sha(_tensor_bytes(s["torch"])),
            "rng_numpy": _sha(_tensor_bytes(s["numpy"][1]), repr(s["numpy"][2:]).encode()),
            "rng_python": _sha(repr(s["python"]).encode())}


class Certificate:
    """The per-step record of one run: a row after every optimizer step, written as JSON lines at the end."""

    def __init__(self):
        self.rows = []

    def record(self, step: int, samples, lr: float, model, optimizer) -> None:
        row = {"step": step, "samples": [int(i) for i in samples], "lr": float(lr), **rng_digests(),
               "optimizer": optimizer_digest(optimizer), "params": params_digest(model)}
        self.rows.append(row)
        print(f"step {step:>3}/{STEPS}  lr {lr:.6f}  samples {row['samples'][:4]}...  params {row['params']}",
              file=sys.stderr, flush=True)

    def save(self, path) -> None:
        write_text_atomic(path, "".join(json.dumps(r) + "\n" for r in self.rows))


def read_certificate(path) -> list:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def first_difference(reference: list, other: list, steps: range):
    """(step, piece) of the first difference of OTHER's rows from REFERENCE's over STEPS, or None: a step
    either lacks is "missing", a step OTHER has outside STEPS is "extra step"."""
    ref, got = ({r["step"]: r for r in rows} for rows in (reference, other))
    for step in steps:
        if step not in ref or step not in got:
            return step, "missing"
        for piece in PIECES:
            if got[step][piece] != ref[step][piece]:
                return step, piece
    extra = sorted(set(got) - set(steps))
    return (extra[0], "extra step") if extra else None


# --- the arguments every adapter takes --------------------------------------------------------------


def adapter_args(description: str):
    import argparse

    p = argparse.ArgumentParser(description=description)
    p.add_argument("--settings", required=True, help="the audit job's settings file (seed, threads, model.vocab_size)")
    p.add_argument("--tokens", required=True, help="training tokens (.npy)")
    p.add_argument("--scenario", required=True, choices=sorted(SCENARIOS))
    p.add_argument("--mode", required=True, choices=("straight", "stop", "resumed"))
    p.add_argument("--checkpoints", required=True, help="the folder this run's framework checkpoints into")
    p.add_argument("--resume-from", help="resumed: the stopped run's checkpoint folder")
    p.add_argument("--certificate", required=True, help="JSON lines: one row per optimizer step")
    p.add_argument("--weights", help="the final weights (straight, resumed)")
    p.add_argument("--cut-state", help="straight: write the RNG states at the start of the step after the cut; "
                   "resumed --repair rng: read them")
    p.add_argument("--repair", choices=("rng", "samples"), nargs="*", default=[],
                   help="restore these pieces by hand: rng (at the first resumed step), samples (the straight run's "
                   "sample order after the cut, from --reference)")
    p.add_argument("--reference", help="--repair samples: the straight run's certificate")
    p.add_argument("--drop-optimizer", action="store_true",
                   help="negative control: resume from a copy of the checkpoint whose optimizer state is emptied")
    return p


def without_optimizer_state(sd: dict) -> dict:
    """An optimizer state_dict with its per-parameter state (AdamW's moments and step counts) removed: what
    a resume that forgot the optimizer loads."""
    return {"state": {}, "param_groups": sd["param_groups"]}


def emptied_optimizer_files(pattern: str):
    """The negative control's edit for a framework that saves the optimizer's state_dict alone in a file:
    each file matching PATTERN in the folder rewritten without its per-parameter state."""
    def empty(folder: Path) -> None:
        for path in folder.glob(pattern):
            torch.save(without_optimizer_state(torch.load(path, weights_only=True)), path)

    return empty


def resume_source(args, empty_optimizer) -> Path:
    """The folder a resumed run resumes from: the stopped run's, or for the negative control a copy of it
    in which EMPTY_OPTIMIZER(copy) has emptied the optimizer state, the framework's own file format kept."""
    import shutil
    import tempfile

    source = Path(args.resume_from)
    if not source.is_dir():
        raise UserError(f"resume failed: no checkpoint folder {source}")
    if not args.drop_optimizer:
        return source
    copy = Path(tempfile.mkdtemp(prefix="control-")) / source.name
    shutil.copytree(source, copy)
    empty_optimizer(copy)
    return copy


def resume_failed(e: Exception) -> UserError:
    """The framework's own error at resume, in one line, for the cell to report."""
    text = (str(e).strip().splitlines() or [type(e).__name__])[0]
    return UserError(f"resume failed: {type(e).__name__}: {text[:200]}")


def run_adapter(main) -> None:
    """run_cli, except that a failed resume is a result, not a crash: the certificate holds one row saying
    why and the weights file is empty, so the DAG goes on and the cell reports it."""
    from .checkpoint import save_atomic
    from .errors import run_cli

    def guarded():
        try:
            main()
        except UserError as e:
            if not str(e).startswith("resume failed"):
                raise
            args = adapter_args("").parse_known_args()[0]
            write_text_atomic(args.certificate, json.dumps({"failed": str(e)}) + "\n")
            if args.weights:
                save_atomic({}, args.weights)
            print(f"audit: {e}", file=sys.stderr)

    run_cli(guarded)


def load_inputs(args, framework: str):
    """(settings, scenario, dataset) for FRAMEWORK's adapter, every failure one line (a framework not
    installed among them)."""
    require(framework)
    from .config import load_config
    from .data import load_tokens

    settings = load_config(args.settings)
    torch.set_num_threads(settings.threads)  # the same thread count for every job: the same sums
    scenario, vocab = SCENARIOS[args.scenario], settings.model.vocab_size
    replay = None
    if "samples" in args.repair:
        replay = [i for row in read_certificate(args.reference) if row["step"] > scenario.cut for i in row["samples"]]
    return settings, scenario, Windows(load_tokens(args.tokens, vocab, SAMPLES * SEQ_LEN), replay)


def save_weights(model, path) -> None:
    from .checkpoint import save_atomic

    save_atomic({k: v.detach().clone() for k, v in model.state_dict().items()}, path)


class CutState:
    """The straight run's RNG states at the start of the first step after the cut (written), and the repair
    that puts them back by hand at the same point of a resumed run (read)."""

    def __init__(self, args, cut: int):
        self.args, self.step = args, cut + 1

    def at_step_start(self, step: int) -> None:
        if step != self.step or not self.args.cut_state:
            return
        from .checkpoint import load_file, save_atomic

        if self.args.mode == "straight":
            save_atomic(rng_states(), self.args.cut_state)
        elif "rng" in self.args.repair:
            set_rng_states(load_file(self.args.cut_state, "cut state"))


# --- judging a cell -------------------------------------------------------------------------------------


def weights_gap(a: dict, b: dict) -> tuple[bool, float]:
    """(bit-identical, max |Δw|) of two weights files' state_dicts."""
    from .checkpoint import compare_state_dicts

    gaps = compare_state_dicts(a, b)
    if not gaps or None in gaps.values():
        return False, math.inf
    return all(g == 0.0 for g in gaps.values()), max(gaps.values())


# --- the runs of a cell: each a new process -------------------------------------------------------------

# what a run imports (the framework, and what torch and the config load lazily): the cell's process imports it
# once, so that each run forked from it does not pay the imports again (most of a run's time)
PRELOAD = {"own": (), "transformers": ("transformers.trainer",), "accelerate": ("accelerate",),
           "lightning": ("lightning.pytorch",)}
PRELOAD_ALWAYS = ("torch._dynamo", "jsonschema", "mmkit.config", "mmkit.data", "mmkit.checkpoint")


class Runs:
    """The runs of one cell (straight, stopped, resumed, a repair, a negative control), each a new process.

    Each is forked from this one, which has imported the framework and the adapter but seeded, built and
    trained nothing: a run starts from what a new interpreter holds after the same imports, and a resumed run
    knows nothing of the stopped one but its checkpoint folder. Python's and numpy's global RNGs, which a new
    interpreter seeds from the OS, are seeded from the OS again in each run; torch's is the one the imports
    left, as in a new interpreter. What the runs of one cell share is the hash seed.
    """

    def __init__(self, row: str, adapter, settings, tokens, scenario: str, cell: Path):
        import importlib.util

        framework, self.recipe = adapter_of(row)
        require(row)
        torch.set_num_threads(1)  # this process compares weights between runs: no OpenMP pool may exist at a fork
        for name in PRELOAD_ALWAYS + PRELOAD[framework]:
            importlib.import_module(name)
        spec = importlib.util.spec_from_file_location(f"audit_{framework}", adapter)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        self.adapter, self.main, self.cell = Path(adapter), module.main, Path(cell)
        self.common = ("--settings", settings, "--tokens", tokens, "--scenario", scenario)

    def run(self, name: str, *args) -> None:
        """The adapter with ARGS in a new process; its output follows this process's, under a line naming it."""
        import tempfile
        import traceback

        with tempfile.TemporaryFile() as log:
            sys.stdout.flush(), sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                code = 1
                try:
                    os.dup2(log.fileno(), 1), os.dup2(log.fileno(), 2)
                    random.seed(), np.random.seed()
                    sys.argv = [str(self.adapter), *map(str, (*self.common, *args)), *self.recipe]
                    run_adapter(self.main)
                    code = 0
                except SystemExit as e:
                    code = e.code if isinstance(e.code, int) else int(e.code is not None)
                except BaseException:
                    traceback.print_exc()
                finally:
                    sys.stdout.flush(), sys.stderr.flush()
                    os._exit(code)
            code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
            log.seek(0)
            output = log.read().decode(errors="replace")
        print(f"--- {self.adapter.name}, {name} run (exit {code}) ---\n{output}", file=sys.stderr, flush=True)
        if code != 0:
            last = (output.strip().splitlines() or ["no message"])[-1].removeprefix("error: ")
            raise UserError(f"the {name} run of {self.adapter.name} failed: {last}")

    def stopped_checkpoints(self) -> Path:
        return self.cell / "stopped" / "checkpoints"

    def straight_stopped_resumed(self, scratch: Path) -> None:
        """The cell's three runs: straight, stopped right after the framework's checkpoint at the cut, resumed."""
        straight, stopped, resumed = (self.cell / name for name in ("straight", "stopped", "resumed"))
        for folder in (straight, stopped, resumed):
            folder.mkdir(parents=True, exist_ok=True)
        self.run("straight", "--mode", "straight", "--checkpoints", scratch / "straight",
                 "--certificate", straight / "certificate.jsonl", "--weights", straight / "weights.pt",
                 "--cut-state", straight / "cut_state.pt")
        self.run("stopped", "--mode", "stop", "--checkpoints", self.stopped_checkpoints(),
                 "--certificate", stopped / "certificate.jsonl")
        self.run("resumed", "--mode", "resumed", "--checkpoints", scratch / "resumed",
                 "--resume-from", self.stopped_checkpoints(), "--certificate", resumed / "certificate.jsonl",
                 "--weights", resumed / "weights.pt")

    def resumed_again(self, out: Path, repair=(), drop_optimizer=False) -> tuple[list, dict]:
        """One more resumed run (a repair that restores REPAIR by hand, or a negative control), in OUT:
        (certificate, weights)."""
        from .checkpoint import load_file

        straight = self.cell / "straight"
        out.mkdir(parents=True, exist_ok=True)
        self.run("negative control" if drop_optimizer else f"{' + '.join(repair)} repair",
                 "--mode", "resumed", "--checkpoints", out / "checkpoints", "--resume-from", self.stopped_checkpoints(),
                 "--certificate", out / "certificate.jsonl", "--weights", out / "weights.pt",
                 "--cut-state", straight / "cut_state.pt", "--reference", straight / "certificate.jsonl",
                 *(["--repair", *repair] if repair else []), *(["--drop-optimizer"] if drop_optimizer else []))
        return read_certificate(out / "certificate.jsonl"), load_file(out / "weights.pt", "weights file")


def judge(framework: str, scenario: str, straight: list, stop: list, resumed: list, straight_w: dict,
          resumed_w: dict, repair_run) -> dict:
    """One row of the matrix. REPAIR_RUN(pieces) -> (certificate, weights) of a resumed run that restores
    those pieces by hand; called while the first difference names a piece a repair can restore."""
    cut = SCENARIOS[scenario].cut
    row = {"framework": framework, "version": version(framework), "torch": torch.__version__.split("+")[0],
           "scenario": scenario, "exact": False, "max_abs_dw": "", "first_step": "", "first_state": "",
           "cause": "", "repair_exact": "", "repaired": [], "deterministic": first_difference(straight, stop, range(1, cut + 1)) is None}
    if resumed and "failed" in resumed[0]:
        return {**row, "cause": resumed[0]["failed"]}
    exact, gap = weights_gap(straight_w, resumed_w)
    first = first_difference(straight, resumed, range(cut + 1, STEPS + 1))
    row.update(exact=exact and first is None, max_abs_dw=f"{gap:.3g}")
    if first:
        row.update(first_step=first[0], first_state=first[1])
    if row["exact"] or not row["deterministic"]:
        return {**row, "cause": "" if row["exact"] else "straight run not deterministic"}
    repaired, pieces = first, []
    while repaired and REPAIR_OF.get(repaired[1]) and REPAIR_OF[repaired[1]] not in pieces:
        pieces.append(REPAIR_OF[repaired[1]])
        certificate, weights = repair_run(pieces)
        repaired = first_difference(straight, certificate, range(cut + 1, STEPS + 1))
        repaired = repaired or (None if weights_gap(straight_w, weights)[0] else (STEPS, "params"))
    if pieces and repaired is None:
        named = " + ".join({"samples": PIECES["samples"], "rng": "the global RNG states"}[p] for p in pieces)
        return {**row, "cause": f"{named}: restored by hand, then bit-exact", "repair_exact": True,
                "repaired": pieces}
    return {**row, "cause": f"cause unknown (certificate: {first[1] if first else 'weights only'})",
            "repair_exact": False if pieces else ""}


# --- the matrix ---------------------------------------------------------------------------------------

COLUMNS = ("framework", "version", "torch", "scenario", "exact", "max_abs_dw", "first_step", "first_state", "cause",
           "repair_exact", "deterministic")


def verdict(row: dict) -> str:
    """exact; repaired (the named piece restored by hand made it exact); failed (the resume did not run);
    unknown (no repair made it exact)."""
    if str(row["exact"]) == "True":
        return "exact"
    if str(row["repair_exact"]) == "True":
        return "repaired"
    return "failed" if row["cause"].startswith("resume failed") else "unknown"


def fp16_as_trained(straight_weights: dict) -> dict:
    """{framework: what its fp16 straight run really trained in}: "fp32" or "bf16" where its weights are bit
    for bit those of its fp32 (mid_epoch) or bf16 straight run, else "fp16". STRAIGHT_WEIGHTS: {(framework,
    scenario): state_dict}."""
    from .checkpoint import compare_state_dicts

    def same(a, b):
        return a in straight_weights and b in straight_weights and all(
            g == 0.0 for g in compare_state_dicts(straight_weights[a], straight_weights[b]).values())

    found = {}
    for framework in dict.fromkeys(f for f, s in straight_weights if s == "fp16"):
        as_fp32, as_bf16 = (same((framework, "fp16"), (framework, other)) for other in ("mid_epoch", "bf16"))
        found[framework] = "fp32" if as_fp32 else "bf16" if as_bf16 else "fp16"
    return found


def summary_table(rows: list, controls: list, fp16: dict) -> str:
    """summary.md: frameworks by scenarios, each cell its verdict and, where not exact, the first step and
    piece that differ; then the negative controls, what fp16 really trained in (FP16, from fp16_as_trained)
    and the versions."""
    scenarios = list(dict.fromkeys(r["scenario"] for r in rows))
    frameworks = list(dict.fromkeys(r["framework"] for r in rows))
    by = {(r["framework"], r["scenario"]): r for r in rows}

    def cell(r):
        v = verdict(r)
        if v == "exact":
            return "exact"
        where = f"step {r['first_step']}: {r['first_state']}" if r["first_step"] != "" else "weights"
        return {"repaired": f"**{where}**, repaired", "unknown": f"**{where}**, cause unknown",
                "failed": "resume failed"}[v]

    lines = ["| framework | " + " | ".join(scenarios) + " |", "|---" * (len(scenarios) + 1) + "|"]
    for f in frameworks:
        version = by[f, scenarios[0]]["version"]
        label = f"{f} {version}" if version != "-" else f"{f} (this project)"
        lines.append(f"| {label} | " + " | ".join(cell(by[f, s]) for s in scenarios) + " |")
    exact = sum(verdict(r) == "exact" for r in rows)
    repaired = sum(verdict(r) == "repaired" for r in rows)
    lines += ["", f"{exact} of {len(rows)} cells bit-exact; {repaired} more exact once the piece the certificate "
              f"named is restored by hand; {len(rows) - exact - repaired} neither. torch {rows[0]['torch']}; "
              f"{STEPS} optimizer steps, cut per scenario; max |Δw| and causes in matrix.csv."]
    caught = [c for c in controls if c["caught"]]
    lines.append(f"Negative controls (optimizer state emptied): {len(caught)} of {len(controls)} caught at the "
                 "first step after the cut (" + ", ".join(f"{c['framework']}: step {c['first_step']} "
                                                          f"{c['first_state']}" for c in controls) + ").")
    if fp16:
        lines.append("fp16 on CPU, as trained (its straight weights bit for bit those of the fp32 or bf16 run): "
                     + ", ".join(f"{f}: {how}" for f, how in fp16.items()) + ".")
    causes = sorted({r["cause"] for r in rows if verdict(r) != "exact"})
    if causes:
        lines += ["", "Causes: " + "; ".join(causes) + "."]
    return "\n".join(lines) + "\n"


def report_section(rows: list, controls: list) -> str:
    """audit/report.md: the report's section on other trainers: the picture, every non-exact cell with what
    its certificate named and what its repair showed, the controls, the versions."""
    lines = ["## 다른 트레이너의 재개 (other trainers' resume)", "",
             f"Straight vs resumed, {STEPS} optimizer steps of a {SAMPLES}-window dataset, batch {BATCH_SIZE}, "
             "through each framework's own documented resume. Green: bit-exact; amber: exact once the piece the "
             "per-step certificate named was restored by hand; red: no repair made it exact.", "",
             "![the audit matrix](matrix.png)", "", "| framework | scenario | cut | first step | first piece | cause |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        if verdict(r) != "exact":
            lines.append(f"| {r['framework']} | {r['scenario']} | {SCENARIOS[r['scenario']].cut} | {r['first_step']} "
                         f"| {r['first_state']} | {r['cause']} |")
    lines += ["", "Negative controls, each framework's resume from a checkpoint whose optimizer state was emptied:"]
    lines += [f"- {c['framework']}: first difference at step {c['first_step']} ({c['first_state']}); the cut is "
              f"{c['cut']}: {'caught' if c['caught'] else 'NOT caught'} at the first step after it" for c in controls]
    versions = sorted({(r["framework"], r["version"]) for r in rows})
    lines += ["", f"torch {rows[0]['torch']}; " + ", ".join(f"{f} {v}" for f, v in versions if v != "-") + "."]
    return "\n".join(lines) + "\n"

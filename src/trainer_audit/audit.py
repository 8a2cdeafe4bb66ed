"""The audit of other trainers' resume: each cell is a certify run (certkit) of its framework's example script
(examples/), or of this project's run.py, with the scenario chosen by the script's own flags.

What lives here: the scenarios, the command each framework's cell runs, the matrix row made from a verdict,
and the matrix itself. The certificate, the kill, the repairs and the negative control are certify's.
"""

import importlib.metadata
from dataclasses import dataclass, replace

from certkit.runs import CONTROL_PIECE
from certkit.verdict import NAMES as PIECES
from certkit.verdict import REPAIRED, causes

from mmkit.errors import UserError

STEPS = 12  # optimizer steps of every run: an epoch is 8 batches of 4, so 1.5 epochs (6 with accumulation 4)
BATCHES_PER_EPOCH = 8


@dataclass(frozen=True)
class Scenario:
    cut: int  # the framework's checkpoint at this optimizer step; the stopped run is SIGKILLed right after it
    what: str
    workers: int = 0
    dropout: float = 0.0
    accumulation: int = 1
    precision: str = "fp32"  # fp32 | bf16 (autocast) | fp16 (autocast and a GradScaler)
    ranks: int = 1  # processes, DDP over gloo, through the framework's documented launcher
    resume_ranks: int = 0  # resumed on this many ranks instead (certify --resume-command), the global batch kept
    lose: int = 0  # SIGKILLed this many steps after the cut's checkpoint, which are lost (certify --lose)
    again: int = 0  # the resumed run killed again after its checkpoint of this step, and resumed (certify --again)
    warmup: int = 0  # LR warmup steps before the cosine schedule
    random_collator: bool = False  # a collator that draws from the global RNG (masking, augmentation)
    stateful_loader: bool = False  # torchdata's StatefulDataLoader, where the framework takes one
    unsupported: tuple = ()  # (row, why) where the script has no way to do it: the cell says so
    crash: int = 0  # certify --crash: every crash state of the saves up to this step's, auto-resumed


NO_STATEFUL_LOADER = (  # the rows that take no torchdata StatefulDataLoader, and why
    ("own", "run.py's data position is its own value in the resume file (docs/checkpoints.md)"),
    ("transformers", "TrainingArguments.accelerator_config (AcceleratorConfig) has no use_stateful_dataloader "
                     "in transformers 5.23.0"),
    ("lightning_stateful", "its loader is stateful already; the lightning row's cell is torchdata's"))

SCENARIOS = {
    "mid_epoch": Scenario(3, "a cut in the middle of the first epoch, shuffled"),
    "second_epoch": Scenario(BATCHES_PER_EPOCH + 3, "the cut in the second epoch"),
    "epoch_end": Scenario(BATCHES_PER_EPOCH, "the cut exactly at the first epoch's end"),
    "workers2": Scenario(3, "DataLoader workers 2", workers=2),
    "dropout": Scenario(3, "dropout 0.1", dropout=0.1),
    "accumulation4": Scenario(5, "gradient accumulation 4, cut mid-epoch", accumulation=4),
    "bf16": Scenario(3, "bf16 autocast", precision="bf16"),
    "fp16": Scenario(3, "fp16 autocast with a GradScaler", precision="fp16"),
    "lost_steps": Scenario(3, "SIGKILLed 2 steps after the cut's checkpoint", lose=2),
    "two_resumes": Scenario(3, "stopped at 3, resumed, stopped again at 6 in the same epoch, resumed", again=6),
    "warmup": Scenario(3, "a linear LR warmup of 6 steps, then cosine; the cut inside the warmup", warmup=6,
                       unsupported=(("own", "run.py's LR schedule is MiniMind's cosine, without a warmup "
                                             "(mmkit/train.py)"),)),
    "ddp2": Scenario(3, "2 ranks, DDP over gloo, mid-epoch", ranks=2),
    "ddp2_to_1": Scenario(3, "2 ranks, resumed on 1 with twice the accumulation (the same global batch)", ranks=2,
                          resume_ranks=1),
    "ddp2_dropout": Scenario(3, "2 ranks with dropout 0.1: an RNG per rank", ranks=2, dropout=0.1),
    "random_collator": Scenario(3, "a collator that masks tokens at random", random_collator=True, unsupported=(
        ("own", "run.py's data path has no collator option (docs/checkpoints.md: the data position is a value)"),)),
    "stateful_loader": Scenario(3, "torchdata's StatefulDataLoader, its state saved by the framework",
                                stateful_loader=True, unsupported=NO_STATEFUL_LOADER),
    "stateful_ddp2": Scenario(3, "the same on 2 ranks (accelerate #4195: the position restored, the shuffle "
                                 "order not)", ranks=2, stateful_loader=True, unsupported=NO_STATEFUL_LOADER),
}
CRASH = ("a crash inside the saves of steps 3 and 6 (certify --crash): every state a kill or a power loss "
         "may leave, resumed through the framework's own auto-resume")
SCENARIOS["crash"] = Scenario(3, CRASH, crash=6)
SCENARIOS["crash_ddp2"] = Scenario(3, CRASH + ", on 2 ranks", ranks=2, crash=6)
CRASH_POINTS = 16  # certify --max-points of a crash cell: the states resumed, half per failure model
CONTROL_SCENARIO = "mid_epoch"  # the cell that also runs its framework's negative control

# the rows, and the package each needs (None: this project's own run.py, nothing to install)
PACKAGES = {"own": None, "transformers": "transformers", "accelerate": "accelerate", "lightning": "lightning",
            "lightning_stateful": "lightning"}


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


def resumed_on_fewer(scenario: Scenario) -> Scenario:
    """SCENARIO on its resume_ranks, each rank taking as many more micro-batches a step as it has fewer ranks."""
    return replace(scenario, ranks=scenario.resume_ranks,
                   accumulation=scenario.accumulation * scenario.ranks // scenario.resume_ranks, resume_ranks=0)


def command(framework: str, scenario: Scenario, script: str, python: str, own: dict | None = None) -> tuple:
    """(COMMAND, resume arguments, the resumed runs' command or None) of a cell, for certify: FRAMEWORK's
    SCRIPT with SCENARIO as its own flags, under torchrun where it has several ranks (Lightning starts its own).
    OWN: run.py's files for the own row (config, resume_config, data), whose scenario is in its config."""
    argv, resume = one_command(framework, scenario, script, python, own)
    if scenario.crash:
        return (*auto_resume(framework, argv), None)
    if not scenario.resume_ranks:
        return argv, resume, None
    if framework == "own":  # run.py continues on another world size from a resume file, with --reshard
        own = {**own, "config": own["resume_config"], "checkpoints": False}
        resume = f"--resume {{run}}/checkpoints/step_{scenario.cut:06d}.pth --reshard"
    return argv, resume, one_command(framework, resumed_on_fewer(scenario), script, python, own)[0]


def straight_source(framework: str, scenario: str, scenarios: list) -> str | None:
    """The scenario among SCENARIOS (the audit's, in their order) whose cell's straight run SCENARIO's cell
    reuses (certify --straight-from), or None: the first other one whose straight run is the same command and
    kept all this one needs (its inputs after the cut, for a repair: any but --again). The own row runs its
    cell's own config file, so its cells share none."""
    mine = SCENARIOS[scenario]

    def straight(s: Scenario):
        return one_command(framework, s, "SCRIPT", "PYTHON")[0], s.cut

    if framework == "own" or mine.crash or mine.unsupported and framework in dict(mine.unsupported):
        return None
    for other in scenarios[:scenarios.index(scenario)] if scenario in scenarios else scenarios:
        s = SCENARIOS[other]
        if not s.again and not s.crash and framework not in dict(s.unsupported) and straight(s) == straight(mine):
            return other
    return None


def auto_resume(framework: str, argv: list) -> tuple:
    """(ARGV, resume arguments) for a crash cell: FRAMEWORK's own documented auto-resume, which picks the
    checkpoint itself. Trainer: resume_from_checkpoint=True, the newest checkpoint-N
    (https://huggingface.co/docs/transformers/en/main_classes/trainer#transformers.Trainer.train); Accelerate:
    the step_k folder with the highest k (load_state's rule for its automatic names); Lightning:
    fit(ckpt_path="last") with ModelCheckpoint(save_last=True)
    (https://lightning.ai/docs/pytorch/stable/common/trainer.html#fit); own: run.py's from its folder."""
    return {"own": (argv, ""), "transformers": (argv, "--resume_from_checkpoint true"),
            "accelerate": (argv, "--resume_from_checkpoint latest")}.get(
        framework, ([*argv, "--save_last"], "--ckpt_path last"))


def one_command(framework: str, scenario: Scenario, script: str, python: str, own: dict | None = None) -> tuple:
    s, flags = scenario, []
    launch = [python]
    if s.ranks > 1 and framework != "lightning" and framework != "lightning_stateful":
        # torchrun: https://docs.pytorch.org/docs/stable/elastic/run.html; Trainer and Accelerate scripts run
        # under it as they are (https://huggingface.co/docs/accelerate/basic_tutorials/launch#using-torchrun)
        launch = [python, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(s.ranks)]
    if framework == "own":  # auto-resumes from its checkpoint folder: no resume arguments
        checkpoints = ["--checkpoint-dir", "{run}/checkpoints"] if own.get("checkpoints", True) else []
        return [*launch, script, "--config", own["config"], *own["data"], "--out", "{run}/weights.pth", *checkpoints], ""
    if framework == "transformers":
        flags = ["--output_dir", "{run}", "--save_steps", s.cut, "--dropout", s.dropout,
                 "--gradient_accumulation_steps", s.accumulation, "--dataloader_num_workers", s.workers]
        flags += {"fp32": [], "bf16": ["--bf16"], "fp16": ["--fp16"]}[s.precision]
        flags += ["--random_collator"] if s.random_collator else []
        flags += ["--warmup_steps", s.warmup] if s.warmup else []
        resume = "--resume_from_checkpoint {run}/checkpoint-{step}"
    elif framework == "accelerate":
        flags = ["--output_dir", "{run}", "--checkpointing_steps", s.cut, "--dropout", s.dropout,
                 "--gradient_accumulation_steps", s.accumulation, "--num_workers", s.workers,
                 "--mixed_precision", {"fp32": "no"}.get(s.precision, s.precision)]
        flags += ["--random_collator"] if s.random_collator else []
        flags += ["--use_stateful_dataloader"] if s.stateful_loader else []
        flags += ["--warmup_steps", s.warmup] if s.warmup else []
        resume = "--resume_from_checkpoint {run}/step_{step}"
    else:  # lightning, lightning_stateful
        flags = ["--out", "{run}", "--every", s.cut, "--dropout", s.dropout, "--accumulate_grad_batches",
                 s.accumulation, "--num_workers", s.workers,
                 "--precision", {"fp32": "32-true", "bf16": "bf16-mixed", "fp16": "16-mixed"}[s.precision]]
        flags += ["--devices", s.ranks] + (["--stateful_loader"] if framework == "lightning_stateful" else [])
        flags += ["--random_collator"] if s.random_collator else []
        flags += ["--torchdata"] if s.stateful_loader else []
        flags += ["--warmup_steps", s.warmup] if s.warmup else []
        resume = "--ckpt_path {run}/step={step}.ckpt"
    return [*launch, script, "--max_steps", STEPS, *flags], resume


def own_config(base: dict, scenario: Scenario, settings: dict, ranks: int | None = None) -> dict:
    """run.py's settings for the own row: BASE (presets/certify-own.yaml) with the audit's seed, threads and
    vocabulary (SETTINGS), its sizes, a checkpoint at every cut, and SCENARIO on RANKS (default its own);
    MiniMind's own data format, so that it has epochs and DataLoader workers, but the windows format where
    it has several ranks (run.py runs MiniMind's on one rank: an epoch's short last batch cannot be cut into
    equal rank slices). Resumed on fewer ranks, each batch is cut into as many slices as the straight run has
    ranks, so that the global batch is summed in the same order on either."""
    slices = scenario.ranks if scenario.resume_ranks else base["parallel"]["batch_slices"]
    return {**base, "seed": settings["seed"], "threads": settings["threads"], "steps": STEPS, "batch_size": 4,
            "accumulation_steps": scenario.accumulation, "precision": scenario.precision,
            "model": {**base["model"], "dropout": scenario.dropout, "vocab_size": settings["model"]["vocab_size"]},
            "checkpoint": {**base["checkpoint"], "every": scenario.cut},
            "parallel": {**base["parallel"], "world_size": ranks or scenario.ranks, "batch_slices": slices},
            "data": {**base["data"], "format": own_format(scenario), "workers": scenario.workers}}


def own_format(scenario: Scenario) -> str:
    return "minimind" if scenario.ranks == 1 else "windows"


def blank_row(framework: str, scenario: str) -> dict:
    """A matrix row of FRAMEWORK's SCENARIO cell with no verdict in it yet."""
    import torch

    return {"framework": framework, "version": version(framework), "torch": torch.__version__.split("+")[0],
            "scenario": scenario, "exact": False, "max_abs_dw": "", "first_step": "", "first_state": "",
            "first_rank": "", "cause": "", "diagnosis": "", "repair_exact": "", "repaired": [], "deterministic": ""}


def row_of(framework: str, scenario: str, found: dict) -> dict:
    """One row of the matrix from certify's verdict FOUND (certkit.runs.certify with repair): exact when every
    step of the certificates and the final parameters agree; otherwise the first step and piece, and what the
    repairs showed."""
    row = {**blank_row(framework, scenario), "deterministic": found["deterministic"]}
    if found.get("max_abs_dw") is not None:
        row["max_abs_dw"] = f"{found['max_abs_dw']:.3g}"
    row["exact"] = found["exact"] and found.get("max_abs_dw") == 0.0
    first = found["first"]
    if first:
        row.update(first_step=first["step"], first_state=first["piece"], first_rank=first["rank"])
    row["diagnosis"] = causes(found) or ""  # certify's why, where the verdict is not exact
    if row["exact"]:
        return row
    if found.get("again"):
        return {**row, "cause": "not repaired: two resumes (a repair puts the pieces back once, after the cut)"}
    if found.get("ranks"):  # another world size: the update's inputs differ, which no repair puts back
        n = found["ranks"]
        what = f"first differs in {PIECES[first['piece']]}" if first else "the final weights differ"
        return {**row, "cause": f"resumed on {n['resumed']} of {n['straight']} ranks: {what} (each process's "
                                "samples and RNG are not compared: a difference in them shows there)"}
    repair = found.get("repair", {})
    if repair.get("exact"):
        named = " + ".join(REPAIRED[p] for p in repair["restored"])
        return {**row, "cause": f"{named}: restored by hand, then bit-exact", "repair_exact": True,
                "repaired": repair["restored"]}
    return {**row, "cause": f"cause unknown (certificate: {first['piece'] if first else 'weights only'})",
            "repair_exact": False if repair.get("restored") else "", "repaired": repair.get("restored", [])}


def crash_row(framework: str, scenario: str, found: dict) -> dict:
    """The matrix row of a crash cell from certify --crash's FOUND (crash.json): exact when no state resumed
    failed; the counts per failure model and outcome in "crash", and in the cause."""
    counts = found["counts"]
    said = "; ".join(f"{model}: " + ", ".join(f"{n} {o}" for o, n in c.items() if n) for model, c in counts.items())
    return {**blank_row(framework, scenario), "exact": found["exact"], "cause": f"crash states resumed: {said}",
            "crash": counts, "events": found["events"], "states": found["states"],
            "resumed": found["resumed"]}


def control_of(framework: str, found: dict) -> dict:
    """The negative control's row from the verdict of its framework's CONTROL_SCENARIO cell."""
    control = found["control"]
    # caught: the optimizer state differs at the step after the cut (certify's rule), whatever came before it
    first = {"step": found["stop_after"] + 1, "piece": CONTROL_PIECE} if control["caught"] else control["first"] or {}
    return {"framework": framework, "version": version(framework), "scenario": CONTROL_SCENARIO,
            "control": "optimizer state emptied", "repairs": control["restored"], "cut": found["stop_after"],
            "first_step": first.get("step"), "first_state": first.get("piece"), "caught": control["caught"],
            "outcome": control.get("outcome", "caught" if control["caught"] else "not caught"),
            "why": control.get("why", "")}


# --- the matrix ---------------------------------------------------------------------------------------

COLUMNS = ("framework", "version", "torch", "scenario", "exact", "max_abs_dw", "first_step", "first_state", "cause",
           "diagnosis", "repair_exact", "deterministic")


def unsupported(row: dict) -> dict:
    """A cell whose script has no way to run its scenario (ROW without a verdict): it says why."""
    why = dict(SCENARIOS[row["scenario"]].unsupported)[row["framework"]]
    return {**row, "cause": f"not supported: {why}"}


def verdict(row: dict) -> str:
    """exact; repaired (the named piece restored by hand made it exact); failed (the resume did not run, or a
    release could not run the script at all); unknown (no repair made it exact); crash (a crash cell with a
    state whose resume was not exact); unsupported (the script cannot run the scenario, or a release cannot be
    installed beside this torch: skipped)."""
    if row["cause"].startswith(("not supported", "skipped")):
        return "unsupported"
    if str(row["exact"]) == "True":
        return "exact"
    if row.get("crash"):
        return "crash"
    if str(row["repair_exact"]) == "True":
        return "repaired"
    return "failed" if row.get("failed") else "unknown"


def fp16_as_trained(straight_weights: dict) -> dict:
    """{framework: what its fp16 straight run really trained in}: "fp32" or "bf16" where its final parameters
    are bit for bit those of its fp32 (mid_epoch) or bf16 straight run, else "fp16". STRAIGHT_WEIGHTS:
    {(framework, scenario): list of parameters (the recorder's rank0.final.pt)}."""
    import torch

    def same(a, b):
        x, y = straight_weights.get(a), straight_weights.get(b)
        return x is not None and y is not None and len(x) == len(y) and all(
            s.shape == t.shape and torch.equal(s, t) for s, t in zip(x, y))

    found = {}
    for framework in dict.fromkeys(f for f, s in straight_weights if s == "fp16"):
        as_fp32, as_bf16 = (same((framework, "fp16"), (framework, other)) for other in ("mid_epoch", "bf16"))
        found[framework] = "fp32" if as_fp32 else "bf16" if as_bf16 else "fp16"
    return found


def cell_text(r: dict) -> str:
    """A matrix cell in Markdown, as summary.md (and the site, rendered) shows it: its verdict and, where not
    exact, the first step and piece that differ, in bold."""
    v = verdict(r)
    if v == "exact":
        return "exact"
    rank = f", rank {r['first_rank']}" if SCENARIOS[r["scenario"]].ranks > 1 else ""
    where = f"step {r['first_step']}{rank}: {r['first_state']}" if r["first_step"] != "" else "weights"
    if r["cause"].startswith("not repaired"):
        return f"**{where}**, not repaired"
    if r["cause"].startswith("resumed on"):  # another world size: no repair puts back what it changes
        return f"**{where}**, on fewer ranks"
    if v == "crash":
        return f"**{sum(sum(c[o] for o in c if o != 'exact') for c in r['crash'].values())} crash points fail**"
    return {"repaired": f"**{where}**, repaired", "unknown": f"**{where}**, cause unknown",
            "failed": "resume failed", "unsupported": "not supported"}[v]


def summary_table(rows: list, controls: list, fp16: dict) -> str:
    """summary.md: frameworks by scenarios, each cell its verdict and, where not exact, the first step and
    piece that differ; then the negative controls, what fp16 really trained in (FP16, from fp16_as_trained)
    and the versions."""
    scenarios = list(dict.fromkeys(r["scenario"] for r in rows))
    frameworks = list(dict.fromkeys(r["framework"] for r in rows))
    by = {(r["framework"], r["scenario"]): r for r in rows}
    lines = ["| framework | " + " | ".join(scenarios) + " |", "|---" * (len(scenarios) + 1) + "|"]
    for f in frameworks:
        version = by[f, scenarios[0]]["version"]
        label = f"{f} {version}" if version != "-" else f"{f} (this project)"
        lines.append(f"| {label} | " + " | ".join(cell_text(by[f, s]) for s in scenarios) + " |")
    crashes = [r for r in rows if r.get("crash")]
    rows = [r for r in rows if not r.get("crash")]
    exact = sum(verdict(r) == "exact" for r in rows)
    repaired = sum(verdict(r) == "repaired" for r in rows)
    judged = [r for r in rows if verdict(r) != "unsupported"]
    lines += ["", f"{exact} of {len(judged)} cells bit-exact; {repaired} more exact once the piece the certificate "
              f"named is restored by hand; {len(judged) - exact - repaired} neither"
              + (f"; {len(rows) - len(judged)} not supported by their script" if len(judged) < len(rows) else "")
              + f". torch {rows[0]['torch']}; "
              f"{STEPS} optimizer steps, cut per scenario; max |Δw| and causes in matrix.csv."]
    caught = [c for c in controls if c["caught"]]
    lines.append(f"Negative controls (optimizer state emptied): {len(caught)} of {len(controls)} caught at the "
                 "first step after the cut (" + ", ".join(f"{c['framework']}: " + (
                     f"step {c['first_step']} {c['first_state']}" if c["outcome"] != "inconclusive" else "inconclusive")
                     for c in controls) + ").")
    if fp16:
        lines.append("fp16 on CPU, as trained (its straight weights bit for bit those of the fp32 or bf16 run): "
                     + ", ".join(f"{f}: {how}" for f, how in fp16.items()) + ".")
    diagnosed = [r for r in rows if verdict(r) not in ("exact", "unsupported", "failed")]
    if diagnosed:
        lines += ["", "Not exact, and why (certify's diagnosis of the first difference):", "",
                  "| framework | scenario | first difference | diagnosed cause |", "|---|---|---|---|"]
        lines += [f"| {r['framework']} | {r['scenario']} | "
                  + (f"step {r['first_step']}: {r['first_state']}" if r["first_step"] != "" else "weights only")
                  + f" | {r.get('diagnosis') or 'none (not diagnosed)'} |" for r in diagnosed]
    if crashes:
        lines += ["", crash_table(crashes)]
    causes = sorted({r["cause"] for r in rows if verdict(r) != "exact"})
    if causes:
        lines += ["", "Causes: " + "; ".join(causes) + "."]
    return "\n".join(lines) + "\n"


def crash_table(rows: list) -> str:
    """The crash cells' counts: for each framework and number of ranks, the crash points resumed per failure
    model and outcome (certify --crash: a point is a file event and what a kill or power loss there left)."""
    from certkit.verdict import OUTCOMES

    models = list(rows[0]["crash"])
    lines = [f"Crash during the save (the {', '.join(dict.fromkeys(r['scenario'] for r in rows))} columns: "
             f"certify --crash, at most {CRASH_POINTS} distinct states resumed a cell, through each framework's "
             "own auto-resume), crash points by outcome, " + " / ".join(OUTCOMES) + ":", "",
             "| framework | ranks | file events | distinct states (resumed) | "
             + " | ".join(models) + " |", "|---" * (4 + len(models)) + "|"]
    for r in rows:
        lines.append(f"| {r['framework']} | {SCENARIOS[r['scenario']].ranks} | {r['events']} | {r['states']} "
                     f"({r['resumed']}) | " + " | ".join(" / ".join(str(r["crash"][m][o]) for o in OUTCOMES)
                                                       for m in models) + " |")
    return "\n".join(lines)


def report_section(rows: list, controls: list) -> str:
    """audit/report.md: the report's section on other trainers: the picture, every non-exact cell with what
    its certificate named and what its repair showed, the controls, the versions."""
    lines = ["## 다른 트레이너의 재개 (other trainers' resume)", "",
             f"Straight vs resumed, {STEPS} optimizer steps, {BATCHES_PER_EPOCH} batches an epoch: each cell a certify "
             "run of the framework's example script (examples/) through its own documented resume. Green: "
             "bit-exact; amber: exact once the piece the per-step certificate named was restored by hand; red: no "
             "repair made it exact.", "",
             "![the audit matrix](matrix.png)", "", "| framework | scenario | cut | first step | first piece | cause |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        if verdict(r) != "exact":
            lines.append(f"| {r['framework']} | {r['scenario']} | {SCENARIOS[r['scenario']].cut} | {r['first_step']} "
                         f"| {r['first_state']} | {r['cause']} |")
    lines += ["", "Negative controls, each framework's resume with its optimizer state emptied before the first update:"]
    lines += [f"- {c['framework']}: " + (f"inconclusive ({c['why']})" if c["outcome"] == "inconclusive" else
                                         f"first difference at step {c['first_step']} ({c['first_state']}); the cut is "
                                         f"{c['cut']}: {c['outcome'].replace('not', 'NOT')} at the first step after it")
              for c in controls]
    versions = sorted({(r["framework"], r["version"]) for r in rows})
    lines += ["", f"torch {rows[0]['torch']}; " + ", ".join(f"{f} {v}" for f, v in versions if v != "-") + "."]
    return "\n".join(lines) + "\n"


# --- the audit across releases (snakemake audit_releases) ----------------------------------------------

RELEASE_COLUMNS = ("framework", "version", "with", "torch", "scenario", "exact", "first_step", "first_piece",
                   "repair_exact", "cause")


def release_name(requirements: str) -> str:
    """A release environment's name: "transformers==4.56.2 accelerate==1.10.1" is
    transformers-4.56.2+accelerate-1.10.1."""
    return "+".join(r.replace("==", "-") for r in requirements.split())


def rows_of_package(package: str) -> list:
    """The audit's rows that run PACKAGE's example: lightning's two (plain and stateful loader)."""
    return [row for row, p in PACKAGES.items() if p == package]


def in_release(row: dict, release: dict) -> dict:
    """ROW as run in a release's environment (RELEASE: release_env.py's versions.json): the framework's version
    there, and the versions of the packages its resume goes through ("with")."""
    package = PACKAGES[row["framework"]]
    others = " ".join(f"{p} {v}" for p, v in release.items() if p not in (package, "torch", "python", "skipped"))
    return {**row, "version": release[package], "with": others, "torch": release["torch"].split("+")[0]}


def release_order(row: dict) -> tuple:
    """Oldest first: by the framework's version, then by those of the packages it goes through."""
    from packaging.version import Version

    return (Version(row["version"]), *(Version(v) for v in row["with"].split()[1::2]))


def release_label(row: dict) -> str:
    return row["version"] + (f" ({row['with']})" if row["with"] else "")


def first_exact(rows: list) -> str:
    """The release from which every later one audited is exact (ROWS: one framework and scenario, oldest
    first): the fix's first release, as far as these releases can tell. Skipped releases say nothing."""
    rows = [r for r in rows if verdict(r) != "unsupported"]
    if not rows:
        return "none audited"
    later = len(rows)
    while later > 0 and verdict(rows[later - 1]) == "exact":
        later -= 1
    if later == len(rows):
        last = rows[-1]
        where = f"step {last['first_step']}: {last['first_state']}" if last["first_step"] != "" else verdict(last)
        return f"none yet ({release_label(last)}: {where})"
    if later == 0:
        return f"{release_label(rows[0])} or earlier"
    return release_label(rows[later])


def releases_table(rows: list) -> str:
    """releases.md: the first release exact for each framework and scenario, then every release's verdicts."""
    scenarios = list(dict.fromkeys(r["scenario"] for r in rows))
    frameworks = list(dict.fromkeys(r["framework"] for r in rows))
    by = {}
    for r in sorted(rows, key=release_order):
        by.setdefault((r["framework"], r["scenario"]), []).append(r)
    lines = ["First release exact (every later release audited is exact too):", "",
             "| framework | " + " | ".join(scenarios) + " |", "|---" * (len(scenarios) + 1) + "|"]
    lines += [f"| {f} | " + " | ".join(first_exact(by[f, s]) for s in scenarios) + " |" for f in frameworks]
    lines += ["", "Every release:", "", "| framework | release | " + " | ".join(scenarios) + " |",
              "|---" * (len(scenarios) + 2) + "|"]
    for f in frameworks:
        for i, r in enumerate(by[f, scenarios[0]]):
            cells = []
            for s in scenarios:
                c = by[f, s][i]
                v = verdict(c)
                shown = {"exact": "exact", "failed": "failed", "unsupported": "skipped"}
                cells.append(shown.get(v) or f"step {c['first_step']}: {c['first_state']}")
            lines.append(f"| {f} | {release_label(r)} | " + " | ".join(cells) + " |")
    lines += ["", f"torch {rows[0]['torch']} in every environment; {STEPS} optimizer steps, cut per scenario "
              "(docs/audit.md); first step and piece from each cell's certificate."]
    return "\n".join(lines) + "\n"

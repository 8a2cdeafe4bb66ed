"""The ablations: a resume that forgets (or re-derives) a piece of its state, as buggy resume code does.

Each Ablation names the entries of the resume (mmkit.checkpoint.entries.ENTRIES) it throws away: they are named on
stderr, not checked, not put back. Its apply() then says where the run continues instead: the data from
the start, from the epoch's first batch, or from MiniMind's rescaled step. mmkit.checkpoint.manager.resume calls it
after the rest of the resume is put back; the resume's I/O knows nothing of any of them.
"""

import sys
from argparse import ArgumentParser, Namespace
from collections.abc import Callable
from dataclasses import dataclass

from .errors import UserError


@dataclass(frozen=True)
class ResumeOptions:
    """How a new run takes a resume: the ablations it applies, and what it lets differ."""

    ablations: tuple = ()
    allow_mismatch: bool = False  # resume despite other settings (not bit-exact)
    reshard: bool = False  # the resume was saved at another world size

    def flags(self) -> list:
        """The command-line flags these options are spelled with (a run's origin records them)."""
        return ([a.flag for a in self.ablations] + ["--reshard"] * self.reshard
                + ["--allow-mismatch"] * self.allow_mismatch)

    def drops(self) -> tuple:
        return tuple(dict.fromkeys(name for a in self.ablations for name in a.drops))

    @property
    def restarts_schedule(self) -> bool:
        return ABLATIONS["restart_schedule"] in self.ablations

    @property
    def replays_an_epoch(self) -> bool:
        return ABLATIONS["replay"] in self.ablations


def from_the_start(live, saved, expected) -> None:
    live.batch_generator.manual_seed(expected.seed)  # back to step 1's batches: what a rewound sampler does
    live.batches.position = expected.plan.position(0)


def from_the_epochs_start(live, saved, expected) -> None:
    live.batches.position = {"epoch": saved["data_position"]["epoch"], "batch": 0}


def rescaled(live, saved, expected) -> None:
    """MiniMind's rule for another world size: the step scaled by the world sizes, data order re-derived."""
    saved_ws, ws = saved["fingerprint"].get("world_size", 1), live.ranks.world_size
    live.step = saved["step"] * saved_ws // ws
    print(f"resume: MiniMind's rescale: step {saved['step']} * {saved_ws} // {ws} = {live.step}; "
          f"data order re-derived from there", file=sys.stderr)
    live.batch_generator.set_state(expected.gen_state(live.step))
    live.batches.position = expected.position(live.step)


@dataclass(frozen=True)
class Ablation:
    """One ablation, declared once: its flag and its job keep the task text's spellings (--no-optim, noopt.pth);
    the argparse dest follows from the flag (no_optim), by argparse's own rule."""

    flag: str
    job: str  # the run the pipeline trains with it: its rule, its artifact's stem, its row in the report
    drops: tuple = ()  # entries thrown away: named, not checked, not put back
    help: str = ""
    restart: Callable | None = None  # (live, saved, expected): where the data continues instead
    reshard: bool = False  # a rule for another world size: only with --reshard (dist.smk's job, not train.smk's)

    @property
    def dest(self) -> str:
        return self.flag.removeprefix("--").replace("-", "_")

    def apply(self, live, saved: dict, expected) -> None:
        """After the rest of the resume is put into LIVE: what this ablation does instead of its entries.
        Without one, every rank took the file's one data position (rank0_gen: rank 0's, so the others' is lost)."""
        if self.restart:
            self.restart(live, saved, expected)


DATA_POSITION = ("gen_state", "data_position")  # the windows' generator and the position as a value

ABLATIONS = {a.dest: a for a in (
    Ablation("--no-optim", "noopt", ("optimizer",), "start AdamW afresh on resume"),
    Ablation("--no-skip", "noskip", DATA_POSITION, "re-seed the batch generator on resume", from_the_start),
    Ablation("--restart-schedule", "nosched", help="count the LR schedule from 0 on resume"),
    Ablation("--replay", "replay", DATA_POSITION, "(minimind format) replay the epoch from its first batch",
             from_the_epochs_start),
    Ablation("--no-rng", "norng", ("rng_state",), "leave the global RNG (dropout) as a fresh run has it"),
    Ablation("--no-scaler", "noscaler", ("scaler",), "(fp16) start the GradScaler afresh"),
    Ablation("--minimind-rescale", "minimind_rescale", DATA_POSITION,
             "with --reshard: MiniMind's step * saved_ws // current_ws, data order re-derived", rescaled,
             reshard=True),
)}


def add_resume_flags(parser: ArgumentParser) -> None:
    for ablation in ABLATIONS.values():  # each throws away or re-derives entries of the resume
        parser.add_argument(ablation.flag, dest=ablation.dest, action="store_true", help=f"ablation: {ablation.help}")
    parser.add_argument("--reshard", action="store_true", help="continue a resume saved at another world size")
    parser.add_argument("--allow-mismatch", action="store_true",
                        help="resume despite other settings (not bit-exact)")


def resume_options(args: Namespace) -> ResumeOptions:
    """The flags add_resume_flags declared, as ResumeOptions; one line for a flag without --resume."""
    options = ResumeOptions(tuple(a for name, a in ABLATIONS.items() if getattr(args, name)),
                            args.allow_mismatch, args.reshard)
    if (options.ablations or options.reshard) and not args.resume:
        raise UserError(", ".join(a.flag for a in ABLATIONS.values()) + " and --reshard only make sense with --resume")
    for a in options.ablations:
        if a.reshard and not args.reshard:
            raise UserError(f"{a.flag} is a rule for resuming on another world size: add --reshard")
    return options

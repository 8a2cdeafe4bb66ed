"""Certify a training command's resume: run it straight, SIGKILL it after step K's checkpoint, resume it, and
name the first optimizer step, rank and piece of state where the resumed run leaves the straight one.

  certify --out DIR --stop-after K --resume 'ARGS' -- COMMAND ...

{run} in COMMAND and ARGS is a folder per run, {step} is K ({step:04d}: 0004). Exit 0: exact; 1: not exact;
2: could not judge (one line why, then the failing run's last lines); 128 + N: stopped by signal N.
README.md beside the package says what is recorded and how.
"""

import argparse
import shlex
import signal
import sys
from pathlib import Path

from certkit import processes, reports, saves
from certkit.errors import Interrupted
from certkit.runs import CannotJudge, certify, substitute
from certkit.verdict import headline, why

USAGE = ("certify --out DIR --stop-after K [--resume ARGS] [--lose N] [--again K2] [--resume-command CMD] "
         "[--repair] [--control] [--straight-from DIR] [--timeout S] [--junit FILE] [--summary FILE] -- COMMAND ...")
EPILOG = """\
{run} in COMMAND, ARGS and CMD is a folder of each run's own: DIR/runs/straight for the straight run,
DIR/runs/resumed for the stopped and the resumed run, which share it. {step} is K (K2 in the second
resume of --again), and takes a format spec as Python's format() does: ckpt_{step:04d}.pt is ckpt_0004.pt,
step_{step:06}.pth is step_000004.pth.

ARGS and CMD are one word each (quote them). A value that begins with -- may follow its option as a word of
its own (--resume --auto) or be joined to it (--resume=--auto).

While it runs, certify says on stderr as each run starts and ends, and the steps it has made; the
verdict's line goes to stdout.

exit status:
  0        exact: the resumed run's every step equals the straight run's
  1        not exact: the verdict names the first step, rank and piece that differ
  2        could not judge: one line on stderr why (certify: ...), then the failing run's last lines
  128 + N  stopped by signal N (SIGHUP 129, SIGINT 130, SIGTERM 143): the run ended, no verdict written
"""
VALUED = ("--resume", "--resume-command")  # their value may begin with --, which argparse takes for an option


class OneLineParser(argparse.ArgumentParser):
    """A bad command line is one line and exit 2, as any other bad input to certify."""

    def error(self, message):
        self.exit(2, f"certify: {message} (--help lists the options)\n")


def parser() -> argparse.ArgumentParser:
    p = OneLineParser(usage=USAGE, description=__doc__.split("\n\n")[0], epilog=EPILOG,
                      formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, type=Path, metavar="DIR",
                   help="the verdict, the certificates, the logs and the runs")
    p.add_argument("--stop-after", required=True, type=int, metavar="K",
                   help="K: the step whose checkpoint the resume starts from")
    p.add_argument("--resume", default="", metavar="ARGS",
                   help="arguments added to COMMAND to resume from step K's checkpoint")
    p.add_argument("--lose", type=int, default=0, metavar="N",
                   help="kill N steps after K instead, losing them as a crash does")
    p.add_argument("--again", type=int, default=0, metavar="K2", help="two resumes: the resumed run is killed again "
                   "before step K2 + 1 and resumed from its own checkpoint of K2 (the resume arguments' {step} is K2 "
                   "then)")
    p.add_argument("--resume-command", type=shlex.split, metavar="CMD", help="the resumed runs run this instead of "
                   "COMMAND (then the resume arguments are added to it): resume on another number of ranks, compared "
                   "on the ranks both have in what the update computes from, not in each process's samples and RNG "
                   "states")
    p.add_argument("--timeout", type=float, default=3600, metavar="S",
                   help="seconds each run may take (default 3600)")
    p.add_argument("--repair", action="store_true", help="where the first difference is samples or an RNG, resume "
                   "again with the straight run's model inputs or RNG states put back by hand: exact then means "
                   "they were all the checkpoint forgot")
    p.add_argument("--control", action="store_true", help="negative control: resume once more (with any repairs) "
                   "with the optimizer state emptied before the first update; the verdict must name it at K + 1")
    p.add_argument("--straight-from", type=Path, metavar="DIR", help="reuse the straight run of an earlier certify "
                   "of the same COMMAND (its --out DIR) instead of running it again: for several cuts of one command "
                   "(--lose, --again, --resume-command); refused if it ran another command or kept less state")
    p.add_argument("--crash", action="store_true", help="a crash inside the save: the stopped run's file events "
                   "under {run} recorded, every state a process crash or a power loss may leave of them rebuilt and "
                   "resumed (ARGS with {step}: from each state's newest complete checkpoint; without: the command's "
                   "auto-resume), each named exact, lost work, started over, hard fail or silent "
                   "(crash.md, crash.svg, crash.json)")
    p.add_argument("--max-points", type=int, default=64, metavar="N",
                   help="--crash: resume at most N distinct crash states, shared between the failure models and "
                        "spread evenly within each (default 64)")
    p.add_argument("--jobs", type=int, metavar="N",
                   help="runs at once, each in its own folder (the command must not claim a fixed port or a GPU "
                        "for itself): 2 runs the straight run beside the stopped and resumed runs (default: 2 where "
                        "the CPUs hold two runs' threads, 1 with a GPU or a launcher such as torchrun); with --crash, "
                        "N crash states resumed at once (default 1)")
    p.add_argument("--full", action="store_true", help="run a resume that is not exact to the end and measure "
                   "max |Δw| (by default the runs end once every rank has parted and the steps so far name a cause: "
                   "the verdict is the same)")
    p.add_argument("--failure-model", choices=["both", "process", "power"], default="both",
                   help="--crash: process crash (a kill before each file event, the last write torn), power loss "
                   "(what was not fsynced may be lost), or both (default)")
    p.add_argument("--junit", type=Path, metavar="FILE", help="JUnit XML for CI: this run's testsuite, a testcase "
                   "per rank failing with its first difference (added to FILE's other certify runs)")
    p.add_argument("--summary", type=Path, metavar="FILE", help="Markdown appended to FILE (GitHub: "
                   "$GITHUB_STEP_SUMMARY): the verdict, the first differences, the steps compared, the rerun command")
    return p


def joined(argv: list) -> list:
    """ARGV with `--resume VALUE` written `--resume=VALUE` (and --resume-command's): argparse refuses a value
    of its own word that begins with --, such as --resume --init_from=resume."""
    found, words = [], iter(argv)
    for word in words:
        value = next(words, None) if word in VALUED else None
        found.append(word if value is None else f"{word}={value}")
    return found


def judged(args, command: list) -> dict:
    try:
        resume = shlex.split(args.resume)
    except ValueError as e:
        raise CannotJudge(f"--resume {args.resume!r}: {e}") from None
    substitute([*command, *resume, *(args.resume_command or [])], Path("run"), args.stop_after)  # a bad {step:...}
    if args.crash:
        other = next((o for o, v in (("--lose", args.lose), ("--again", args.again), ("--repair", args.repair),
                                     ("--control", args.control), ("--resume-command", args.resume_command),
                                     ("--straight-from", args.straight_from)) if v), None)
        if other:
            raise CannotJudge(f"--crash resumes every crash state of the saves up to step K's: {other} does not apply")
        models = {"both": saves.MODELS, "process": saves.MODELS[:1], "power": saves.MODELS[1:]}[args.failure_model]
        return saves.certify_crash(command, args.resume, args.out, args.stop_after, args.timeout, args.max_points,
                                   models, 1 if args.jobs is None else args.jobs)
    if args.jobs is not None and args.jobs < 1:
        raise CannotJudge(f"--jobs must be at least 1 (got {args.jobs})")
    return certify(command, args.resume, args.out, args.stop_after, args.lose, args.timeout, args.repair,
                   args.control, args.again, args.resume_command, args.straight_from, args.jobs, args.full)


def report(args, argv: list, found: dict | None, error: str | None = None) -> None:
    """--junit and --summary: the verdict FOUND, or ERROR where certify could not judge."""
    command = shlex.join(argv[argv.index("--") + 1:] if "--" in argv else [])
    crash = args.crash and found is not None
    if args.junit:
        reports.write_junit(args.junit, reports.crash_suite(found, command, args.out) if crash
                            else reports.suite(found, command, args.out, error))
    if args.summary:
        rerun = shlex.join(["certify", *argv])
        reports.append_summary(args.summary, saves.markdown(found, command) + f"\nRerun: `{rerun}`\n" if crash
                               else reports.summary(found, command, args.out, rerun, error))


def main(argv: list | None = None) -> int:
    """The `certify` command (and `python -m certkit`): ARGV, or the process's own arguments."""
    argv = sys.argv[1:] if argv is None else argv
    processes.catch_stops()
    try:
        processes.become_subreaper()
        split = argv.index("--") if "--" in argv else len(argv)
        args = parser().parse_args(joined(argv[:split]))
        try:
            found = judged(args, argv[split + 1:])
        except CannotJudge as e:
            report(args, argv, None, str(e))
            raise
        report(args, argv, found)
    except Interrupted as e:
        processes.ignore_stops()
        print(f"certify: interrupted by {signal.Signals(e.signum).name}: the run in progress and every process "
              "it started were ended; no verdict written", file=sys.stderr)
        return 128 + e.signum
    except CannotJudge as e:
        processes.ignore_stops()
        print(f"certify: {e}", file=sys.stderr)
        if e.log is not None and e.log.exists():
            tail = e.log.read_text(errors="replace").splitlines()[-12:]
            print(f"--- the last lines of {e.log} ---", *tail, sep="\n", file=sys.stderr)
        return 2
    except OSError as e:  # one certkit did not name: still one line, and not "not exact"
        processes.ignore_stops()
        print(f"certify: {e.filename or 'a file'}: {e.strerror or e}", file=sys.stderr)
        return 2
    processes.ignore_stops()  # the verdict is written: it is the answer, whatever signal comes now
    if args.crash:
        said = ", ".join(f"{m}: " + ", ".join(f"{n} {o}" for o, n in c.items() if n)
                         for m, c in found["counts"].items())
        print(f"{'no' if found['exact'] else found['failing']} failing crash point{'s' * (found['failing'] != 1)} "
              f"({said}) ({args.out / 'crash.md'})")
        return 0 if found["exact"] else 1
    print(headline(found).replace("**", ""), f"({args.out / 'verdict.md'})")
    if why(found):
        print(why(found))
    return 0 if found["exact"] else 1


def run() -> None:
    """The console script's entry point: main's status is the process's."""
    sys.exit(main())

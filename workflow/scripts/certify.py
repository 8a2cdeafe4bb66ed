"""Certify a training command's resume: run it straight, SIGKILL it after step K's checkpoint, resume it, and
name the first optimizer step, rank and piece of state where the resumed run leaves the straight one.

  python workflow/scripts/certify.py --out DIR --stop-after K --resume 'ARGS' -- COMMAND ...

{run} in COMMAND and ARGS is a folder per run, {step} is K. Exit 0: exact; 1: not exact; 2: could not judge
(one line why, then the failing run's last lines). docs/certify.md says what is recorded and how.
"""

import argparse
import shlex
import sys
from pathlib import Path

from certkit.runs import CannotJudge, certify
from certkit.verdict import headline


def main(argv: list) -> int:
    split = argv.index("--") if "--" in argv else len(argv)
    p = argparse.ArgumentParser(usage="certify.py --out DIR --stop-after K [--resume ARGS] [--lose N] [--again K2] "
                                "[--resume-command CMD] [--repair] [--control] -- COMMAND ...",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, type=Path, help="the verdict, the certificates, the logs and the runs")
    p.add_argument("--stop-after", required=True, type=int, help="K: the step whose checkpoint the resume starts from")
    p.add_argument("--resume", default="", help="arguments added to COMMAND to resume from step K's checkpoint")
    p.add_argument("--lose", type=int, default=0, help="kill N steps after K instead, losing them as a crash does")
    p.add_argument("--again", type=int, default=0, help="two resumes: the resumed run is killed again before step "
                   "K2 + 1 and resumed from its own checkpoint of K2 (the resume arguments' {step} is K2 then)")
    p.add_argument("--resume-command", type=shlex.split, help="the resumed runs run this instead of COMMAND (then "
                   "the resume arguments are added to it): resume on another number of ranks, compared on the ranks "
                   "both have in what the update computes from, not in each process's samples and RNG states")
    p.add_argument("--timeout", type=float, default=3600, help="seconds each run may take")
    p.add_argument("--repair", action="store_true", help="where the first difference is samples or an RNG, resume "
                   "again with the straight run's model inputs or RNG states put back by hand: exact then means "
                   "they were all the checkpoint forgot")
    p.add_argument("--control", action="store_true", help="negative control: resume once more (with any repairs) "
                   "with the optimizer state emptied before the first update; the verdict must name it at K + 1")
    args = p.parse_args(argv[:split])
    try:
        found = certify(argv[split + 1:], args.resume, args.out, args.stop_after, args.lose, args.timeout,
                        args.repair, args.control, args.again, args.resume_command)
    except CannotJudge as e:
        print(f"certify: {e}", file=sys.stderr)
        if e.log is not None and e.log.exists():
            tail = e.log.read_text(errors="replace").splitlines()[-12:]
            print(f"--- the last lines of {e.log} ---", *tail, sep="\n", file=sys.stderr)
        return 2
    print(headline(found).replace("**", ""), f"({args.out / 'verdict.md'})")
    return 0 if found["exact"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

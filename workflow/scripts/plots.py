"""loss.png (every run's train loss, cut marked) and loss_gap.png (|loss - straight| after the cut)."""

import argparse
from pathlib import Path

from mmkit.atomic import write_atomic
from mmkit.errors import UserError, run_cli
from mmkit.plots import plot_gaps, plot_losses
from mmkit.report import read_loss_log


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--logs", nargs="+", required=True,
                   help="NAME_log.csv files; straight_ and resume_log.csv among them (the cut is resume's last step)")
    p.add_argument("--loss", required=True)
    p.add_argument("--gap", required=True)
    args = p.parse_args()

    losses = {Path(f).name.removesuffix("_log.csv"): read_loss_log(f) for f in args.logs}
    if not {"straight", "resume"} <= losses.keys():
        raise UserError("--logs must include straight_log.csv and resume_log.csv")
    stop_at = max(losses["resume"])
    write_atomic(args.loss, lambda f: plot_losses(losses, stop_at, f))
    write_atomic(args.gap, lambda f: plot_gaps(losses, stop_at, f))


if __name__ == "__main__":
    run_cli(main)

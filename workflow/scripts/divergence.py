"""How far each resumed variant ends from the straight run: weights, train loss after the cut, val loss.

One CSV row per variant; `resumed` is the control and must read 0 in every gap column.
"""

import argparse
import csv
import io

import torch

from mmkit.atomic import write_text_atomic
from mmkit.checkpoint import load_weights
from mmkit.config import load_config, model_config
from mmkit.data import load_tokens
from mmkit.errors import UserError, run_cli
from mmkit.model import MiniMindForCausalLM
from mmkit.report import DIVERGENCE_COLUMNS, read_loss_log
from mmkit.train import EVAL_THREADS, eval_loss


def weight_gap(a: dict, b: dict):
    """max |a-b| over all tensors, relative L2 distance ||a-b|| / ||a||, and how many tensors differ."""
    names = [k for k in a if k != "lm_head.weight"]  # tied: the embedding counted once
    max_abs = max((a[k] - b[k]).abs().max().item() for k in names)
    sq = sum(((a[k] - b[k]).double() ** 2).sum().item() for k in names)
    norm = sum((a[k].double() ** 2).sum().item() for k in names)
    differing = sum(not torch.equal(a[k], b[k]) for k in names)
    return max_abs, (sq / norm) ** 0.5, differing


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--config", required=True)
    p.add_argument("--val", required=True)
    p.add_argument("--straight", nargs=2, metavar=("PTH", "LOG"), required=True)
    p.add_argument("--variant", nargs=3, action="append", metavar=("NAME", "PTH", "LOG"), required=True)
    p.add_argument("--csv", required=True)
    args = p.parse_args()

    cfg = load_config(args.config)
    arch, seq_len = model_config(cfg), cfg.seq_len
    torch.set_num_threads(EVAL_THREADS)
    val = load_tokens(args.val, arch.vocab_size, seq_len + 1, "validation tokens")
    model = MiniMindForCausalLM(arch)

    def val_loss(sd):
        model.load_state_dict(sd)
        return eval_loss(model, val, seq_len)

    ref = load_weights(args.straight[0], model)
    ref_log = read_loss_log(args.straight[1])
    ref_val = val_loss(ref)
    rows = []
    for name, pth, log in args.variant:
        sd = load_weights(pth, model)
        losses = read_loss_log(log)
        after_cut = sorted(losses)  # a resumed run logs only the steps after the cut
        if any(s not in ref_log for s in after_cut) or not after_cut:
            raise UserError(f"{log} covers steps the straight log {args.straight[1]} lacks, or none at all")
        gaps = [abs(losses[s] - ref_log[s]) for s in after_cut]
        max_abs, rel_l2, differing = weight_gap(ref, sd)
        v = val_loss(sd)
        rows.append({
            "variant": name,
            "max_abs_dweight": max_abs,
            "rel_l2_dweight": rel_l2,
            "tensors_differing": differing,
            "final_train_loss": losses[max(losses)],
            "val_loss": v,
            "val_loss_gap": v - ref_val,
            "mean_abs_loss_gap": sum(gaps) / len(gaps),
            "max_abs_loss_gap": max(gaps),
        })
        print(rows[-1])
    rows.insert(0, {"variant": "straight", "final_train_loss": ref_log[max(ref_log)], "val_loss": ref_val,
                    **{c: 0 for c in DIVERGENCE_COLUMNS if c not in ("variant", "final_train_loss", "val_loss")}})
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=DIVERGENCE_COLUMNS, lineterminator="\n")
    w.writeheader()
    w.writerows(rows)
    write_text_atomic(args.csv, buf.getvalue())


if __name__ == "__main__":
    run_cli(main)

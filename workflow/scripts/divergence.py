"""How far each resumed variant ends from the straight run: weights, train loss after the cut, val loss.

One CSV row per variant; `resumed` is the control and must read 0 in every gap column.
"""

import argparse

import torch

from mmkit.atomic import write_csv_atomic, write_text_atomic
from mmkit.checkpoint.files import load_weights
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
    p.add_argument("--straight", nargs=2, metavar=("PTH", "LOG"), help="the reference of every --variant")
    p.add_argument("--variant", nargs=3, action="append", metavar=("NAME", "PTH", "LOG"), default=[])
    p.add_argument("--pair", nargs=6, action="append", default=[],
                   metavar=("NAME", "PTH", "LOG", "REF_NAME", "REF_PTH", "REF_LOG"),
                   help="a variant and the run it is compared with (dist/: each its own reference)")
    p.add_argument("--csv", required=True)
    p.add_argument("--md", help="with --pair: the same rows as a markdown table (the README's dist block)")
    args = p.parse_args()
    if bool(args.straight) != bool(args.variant) or bool(args.variant) == bool(args.pair):
        raise UserError("give --straight with --variant ..., or --pair ...")

    cfg = load_config(args.config)
    arch, seq_len = model_config(cfg), cfg.seq_len
    torch.set_num_threads(EVAL_THREADS)
    val = load_tokens(args.val, arch.vocab_size, seq_len + 1, "validation tokens")
    model = MiniMindForCausalLM(arch)
    runs = {}  # path -> (weights, loss log, val loss): a reference shared by several variants is read once

    def load(pth, log):
        if pth not in runs:
            sd = load_weights(pth, model)
            model.load_state_dict(sd)
            runs[pth] = sd, read_loss_log(log), eval_loss(model, val, seq_len)
        return runs[pth]

    if args.pair:
        rows = [{"variant": name, "reference": ref, "first_step": min(load(pth, log)[1]),
                 **gaps(load(pth, log), load(ref_pth, ref_log), log, ref_log)}
                for name, pth, log, ref, ref_pth, ref_log in args.pair]
        columns = ["variant", "reference", "first_step"] + DIVERGENCE_COLUMNS[1:]
    else:
        ref = load(*args.straight)
        rows = [{"variant": name, **gaps(load(pth, log), ref, log, args.straight[1])} for name, pth, log in args.variant]
        rows.insert(0, {"variant": "straight", "final_train_loss": ref[1][max(ref[1])], "val_loss": ref[2],
                        **{c: 0 for c in DIVERGENCE_COLUMNS if c not in ("variant", "final_train_loss", "val_loss")}})
        columns = DIVERGENCE_COLUMNS
    for row in rows:
        print(row)
    write_csv_atomic(args.csv, columns, rows)
    if args.md:
        write_text_atomic(args.md, pairs_table(rows))


def pairs_table(rows: list[dict]) -> str:
    lines = ["| variant | compared with | first step | max \\|Δw\\| | tensors differing | max \\|Δloss\\| | bit-exact |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| `{r['variant']}` | `{r['reference']}` | {r['first_step']} | {r['max_abs_dweight']:.3g} | "
                     f"{r['tensors_differing']} | {r['max_abs_loss_gap']:.3g} | "
                     f"{'yes' if r['tensors_differing'] == 0 else 'no'} |")
    return "\n".join(lines) + "\n"


def gaps(run, ref, log, ref_log_path) -> dict:
    """How far RUN ends from REF: weights, val loss, and train loss over the steps RUN logged (after its cut)."""
    (sd, losses, v), (ref_sd, ref_log, ref_val) = run, ref
    after_cut = sorted(losses)  # a resumed run logs only the steps after the cut
    if any(s not in ref_log for s in after_cut) or not after_cut:
        raise UserError(f"{log} covers steps the reference log {ref_log_path} lacks, or none at all")
    loss_gaps = [abs(losses[s] - ref_log[s]) for s in after_cut]
    max_abs, rel_l2, differing = weight_gap(ref_sd, sd)
    return {
        "max_abs_dweight": max_abs,
        "rel_l2_dweight": rel_l2,
        "tensors_differing": differing,
        "final_train_loss": losses[max(losses)],
        "val_loss": v,
        "val_loss_gap": v - ref_val,
        "mean_abs_loss_gap": sum(loss_gaps) / len(loss_gaps),
        "max_abs_loss_gap": max(loss_gaps),
    }


if __name__ == "__main__":
    run_cli(main)

"""A loop under Accelerate that checkpoints and resumes as the docs show: certify's example of an Accelerate
run (python examples/accelerate_loop.py, or accelerate launch).

https://huggingface.co/docs/accelerate/usage_guides/checkpoint: accelerator.save_state / load_state, and
skip_first_batches for the batches of the resumed epoch already trained on; the folder step_{k} and the
resume arithmetic as in https://github.com/huggingface/accelerate/blob/main/examples/by_feature/checkpointing.py
(k counts optimizer steps, so k * accumulation batches, as in the no_trainer examples); gradient accumulation
with accelerator.accumulate: https://huggingface.co/docs/accelerate/usage_guides/gradient_accumulation.
--use_stateful_dataloader: DataLoaderConfiguration(use_stateful_dataloader=True), torchdata's StatefulDataLoader,
whose state save_state keeps and load_state restores, "instead of additionally calling skip_first_batches"
(the checkpointing page, "Restoring the state of the DataLoader"). --resume_from_checkpoint latest resumes
from the step_{k} folder with the highest k, the rule load_state() itself applies to the folders of
automatic_checkpoint_naming (the number in the name, not a timestamp). A tiny causal LM on random tokens (tiny_lm.py).
"""

import argparse
import math
from pathlib import Path

import torch
from accelerate import Accelerator
from accelerate.utils import set_seed

from tiny_lm import TinyLM, masking_collate, random_tokens, warmup_cosine


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--output_dir", required=True)
    p.add_argument("--resume_from_checkpoint", help="a step_{k} folder of save_state, or latest: the highest k in "
                   "--output_dir (none there: a fresh start)")
    p.add_argument("--max_steps", type=int, default=12)
    p.add_argument("--checkpointing_steps", type=int, default=4)
    p.add_argument("--dropout", type=float, default=0.0)
    p.add_argument("--gradient_accumulation_steps", type=int, default=1)
    p.add_argument("--num_workers", type=int, default=0, help="DataLoader worker processes")
    p.add_argument("--mixed_precision", choices=("no", "bf16", "fp16"), default="no")
    p.add_argument("--random_collator", action="store_true", help="a collate_fn that masks tokens at random")
    p.add_argument("--warmup_steps", type=int, default=0, help="a linear warmup before the cosine schedule")
    p.add_argument("--use_stateful_dataloader", action="store_true", help="torchdata's StatefulDataLoader")
    args = p.parse_args()
    accumulation = args.gradient_accumulation_steps
    stateful = {}
    if args.use_stateful_dataloader:  # only then: older releases lack the option
        from accelerate.utils import DataLoaderConfiguration

        stateful = {"dataloader_config": DataLoaderConfiguration(use_stateful_dataloader=True)}
    accelerator = Accelerator(cpu=True, mixed_precision=args.mixed_precision, gradient_accumulation_steps=accumulation,
                              **stateful)
    set_seed(0)
    model = TinyLM(args.dropout)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    schedule = warmup_cosine(optimizer, args.max_steps, args.warmup_steps)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(random_tokens()), batch_size=4, shuffle=True,
                                         num_workers=args.num_workers,
                                         collate_fn=masking_collate if args.random_collator else None)
    model, optimizer, loader, schedule = accelerator.prepare(model, optimizer, loader, schedule)

    step, starting_epoch, resume_step = 0, 0, None
    if args.resume_from_checkpoint == "latest":
        folders = sorted(Path(args.output_dir).glob("step_*"), key=lambda f: int(f.name.split("_")[1]))
        args.resume_from_checkpoint = folders[-1] if folders else None
    if args.resume_from_checkpoint:
        accelerator.load_state(args.resume_from_checkpoint)
        step = int(Path(args.resume_from_checkpoint).name.split("_")[1])
        starting_epoch, resume_step = divmod(step * accumulation, len(loader))
    for epoch in range(starting_epoch, math.ceil(args.max_steps * accumulation / len(loader))):
        skip = epoch == starting_epoch and resume_step and not args.use_stateful_dataloader
        batches = accelerator.skip_first_batches(loader, resume_step) if skip else loader
        for (tokens,) in batches:
            with accelerator.accumulate(model):
                loss = model(tokens)
                accelerator.backward(loss)
                optimizer.step()
                schedule.step()
                optimizer.zero_grad()
            if not accelerator.sync_gradients:
                continue
            step += 1
            if step % args.checkpointing_steps == 0:
                accelerator.save_state(str(Path(args.output_dir) / f"step_{step}"))
            if step == args.max_steps:
                return


if __name__ == "__main__":
    main()

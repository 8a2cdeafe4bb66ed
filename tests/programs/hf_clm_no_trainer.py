"""A causal LM trained by a loop of its own, written as most Hugging Face scripts begin: `datasets` and
`transformers` imported at the top, torch only after them (transformers and datasets look torch up with
importlib.util.find_spec before anything imports it). Not this project's code and no certificate code.

Its shape follows transformers' examples/pytorch/language-modeling/run_clm_no_trainer.py
(https://github.com/huggingface/transformers/blob/main/examples/pytorch/language-modeling/run_clm_no_trainer.py):
--config_name / --tokenizer_name / --train_file, tokenize then group_texts into blocks, a shuffled
DataLoader with default_data_collator, AutoModelForCausalLM.from_config, torch.optim.AdamW,
transformers.get_scheduler, --checkpointing_steps N writing {output_dir}/step_{N}, --resume_from_checkpoint
skipping the batches of the epoch already trained on, and model.save_pretrained(output_dir) at the end.
Without Accelerate: the optimizer, the scheduler and the RNG states go in a torch.save of their own
(https://pytorch.org/tutorials/beginner/saving_loading_models.html#saving-loading-a-general-checkpoint-for-inference-and-or-resuming-training),
and each epoch's shuffle order comes from a generator seeded with seed + epoch, so a resumed run draws it again.
"""

import argparse
import os
import random
from itertools import chain, islice

import datasets
import transformers
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, default_data_collator, get_scheduler

import numpy as np  # noqa: E402  (after transformers, as in the scripts this one imitates)
import torch  # noqa: E402
from safetensors.torch import load_file  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config_name", required=True)
    p.add_argument("--tokenizer_name", required=True)
    p.add_argument("--train_file", required=True)
    p.add_argument("--output_dir", required=True)
    p.add_argument("--block_size", type=int, default=32)
    p.add_argument("--per_device_train_batch_size", type=int, default=4)
    p.add_argument("--learning_rate", type=float, default=3e-3)
    p.add_argument("--lr_scheduler_type", default="cosine")
    p.add_argument("--num_warmup_steps", type=int, default=2)
    p.add_argument("--max_train_steps", type=int, default=12)
    p.add_argument("--checkpointing_steps", type=int, default=3)
    p.add_argument("--resume_from_checkpoint")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args()


def rng_states() -> dict:
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}


def set_rng_states(states: dict) -> None:
    random.setstate(states["python"])
    np.random.set_state(states["numpy"])
    torch.set_rng_state(states["torch"])


def save_checkpoint(folder: str, model, optimizer, lr_scheduler, completed_steps: int) -> None:
    os.makedirs(folder, exist_ok=True)
    model.save_pretrained(folder)
    state = {"optimizer": optimizer.state_dict(), "lr_scheduler": lr_scheduler.state_dict(),
             "completed_steps": completed_steps, "rng": rng_states()}
    torch.save(state, os.path.join(folder, "training_state.pt.tmp"))
    os.replace(os.path.join(folder, "training_state.pt.tmp"), os.path.join(folder, "training_state.pt"))


def main():
    args = parse_args()
    transformers.set_seed(args.seed)
    datasets.disable_progress_bars()

    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer_name)
    raw = datasets.load_dataset("json", data_files={"train": args.train_file})
    tokenized = raw.map(lambda batch: tokenizer(batch["text"]), batched=True, remove_columns=["text"])

    def group_texts(examples):  # run_clm_no_trainer's: concatenate, then cut into blocks of block_size
        concatenated = {k: list(chain(*examples[k])) for k in examples}
        total = len(concatenated["input_ids"]) // args.block_size * args.block_size
        blocks = {k: [t[i: i + args.block_size] for i in range(0, total, args.block_size)]
                  for k, t in concatenated.items()}
        blocks["labels"] = blocks["input_ids"].copy()
        return blocks

    train_dataset = tokenized.map(group_texts, batched=True)["train"]

    config = AutoConfig.from_pretrained(args.config_name)
    model = AutoModelForCausalLM.from_config(config)
    model.train()
    decay = [p for n, p in model.named_parameters() if not n.endswith("bias") and "norm" not in n]
    no_decay = [p for n, p in model.named_parameters() if n.endswith("bias") or "norm" in n]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}],
                                  lr=args.learning_rate)
    lr_scheduler = get_scheduler(args.lr_scheduler_type, optimizer=optimizer, num_warmup_steps=args.num_warmup_steps,
                                 num_training_steps=args.max_train_steps)

    def loader(epoch: int) -> DataLoader:
        return DataLoader(train_dataset, shuffle=True, collate_fn=default_data_collator,
                          batch_size=args.per_device_train_batch_size,
                          generator=torch.Generator().manual_seed(args.seed + epoch))

    steps_per_epoch = len(loader(0))
    completed_steps = 0
    if args.resume_from_checkpoint:
        model.load_state_dict(load_file(os.path.join(args.resume_from_checkpoint, "model.safetensors")))
        state = torch.load(os.path.join(args.resume_from_checkpoint, "training_state.pt"), weights_only=False)
        optimizer.load_state_dict(state["optimizer"])
        lr_scheduler.load_state_dict(state["lr_scheduler"])
        set_rng_states(state["rng"])
        completed_steps = state["completed_steps"]
        print(f"Resumed from checkpoint: {args.resume_from_checkpoint} (step {completed_steps})")
    starting_epoch, resume_step = divmod(completed_steps, steps_per_epoch)

    epoch = starting_epoch
    while completed_steps < args.max_train_steps:
        batches = loader(epoch)
        for batch in (islice(batches, resume_step, None) if epoch == starting_epoch else batches):
            loss = model(**batch).loss
            loss.backward()
            optimizer.step()
            lr_scheduler.step()
            optimizer.zero_grad()
            completed_steps += 1
            if completed_steps % args.checkpointing_steps == 0:
                save_checkpoint(os.path.join(args.output_dir, f"step_{completed_steps}"), model, optimizer,
                                lr_scheduler, completed_steps)
            if completed_steps >= args.max_train_steps:
                break
        epoch += 1
    model.save_pretrained(args.output_dir)


if __name__ == "__main__":
    main()

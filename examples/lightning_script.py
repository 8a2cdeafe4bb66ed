"""A Lightning script that checkpoints and resumes as the docs show: certify's example of a Lightning run.

A ModelCheckpoint every N optimizer steps (every_n_train_steps, save_top_k=-1:
https://lightning.ai/docs/pytorch/stable/common/checkpointing_intermediate.html), resumed with
trainer.fit(..., ckpt_path=...) (https://lightning.ai/docs/pytorch/stable/common/checkpointing_basic.html),
seed_everything and deterministic=True (https://lightning.ai/docs/pytorch/stable/common/trainer.html#reproducibility).
--stateful_loader trains on a loader with state_dict() / load_state_dict(), which the fit loop saves in the
checkpoint and restores in the middle of an epoch: the fix Lightning's docs leave to the user for a plain
shuffled DataLoader. --save_last keeps last.ckpt beside them (ModelCheckpoint(save_last=True)), which
--ckpt_path last resumes from: Lightning's own auto-resume (Trainer.fit's ckpt_path,
https://lightning.ai/docs/pytorch/stable/common/trainer.html#fit). --torchdata trains on torchdata's StatefulDataLoader instead, which has that protocol
(https://docs.pytorch.org/data/0.11/torchdata.stateful_dataloader.html). A tiny causal LM on random tokens
(tiny_lm.py).
"""

import argparse

import lightning as L
import torch

from tiny_lm import TinyLM, masking_collate, random_tokens, warmup_cosine

BATCH = 4


class TinyLightning(L.LightningModule):
    def __init__(self, dropout: float, steps: int, warmup: int):
        super().__init__()
        self.lm, self.steps, self.warmup = TinyLM(dropout), steps, warmup

    def on_train_start(self):  # the step a resume starts from (a crash tester's --step-regex reads it)
        self.print(f"training from step {self.global_step}")

    def training_step(self, batch, batch_idx):
        return self.lm(batch[0])

    def configure_optimizers(self):
        optimizer = torch.optim.AdamW(self.parameters(), lr=3e-3)
        return {"optimizer": optimizer, "lr_scheduler": {
            "scheduler": warmup_cosine(optimizer, self.steps, self.warmup), "interval": "step"}}


class EpochSampler(torch.utils.data.Sampler):
    """Each epoch's order from a generator of its own (seed + epoch), from the SKIP-th index on."""

    def __init__(self, size: int, seed: int):
        self.size, self.seed, self.epoch, self.skip = size, seed, 0, 0

    def __len__(self):
        return self.size

    def __iter__(self):
        order = torch.randperm(self.size, generator=torch.Generator().manual_seed(self.seed + self.epoch))
        yield from order[self.skip:].tolist()


class ResumableLoader(torch.utils.data.DataLoader):
    """Its position (epoch, batches yielded) a value Lightning saves in the checkpoint and loads back (its
    _Stateful protocol) before the resumed epoch's iter()."""

    batches = 0

    def __iter__(self):
        if self.batches == len(self):  # the epoch was used up (Lightning stops at len, never at exhaustion)
            self.sampler.epoch, self.batches = self.sampler.epoch + 1, 0
        self.sampler.skip = self.batches * self.batch_size
        for batch in super().__iter__():
            self.batches += 1
            yield batch

    def state_dict(self):
        return {"epoch": self.sampler.epoch, "batches": self.batches}

    def load_state_dict(self, state):
        self.sampler.epoch, self.batches = state["epoch"], state["batches"]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="the folder of the checkpoints (step=K.ckpt)")
    p.add_argument("--ckpt_path", help="a checkpoint to resume from, or last: the newest last.ckpt (--save_last)")
    p.add_argument("--save_last", action="store_true", help="also keep last.ckpt, a copy of the newest checkpoint")
    p.add_argument("--max_steps", type=int, default=12)
    p.add_argument("--every", type=int, default=4)
    p.add_argument("--dropout", type=float, default=0.0)
    p.add_argument("--accumulate_grad_batches", type=int, default=1)
    p.add_argument("--num_workers", type=int, default=0, help="DataLoader worker processes")
    p.add_argument("--precision", choices=("32-true", "bf16-mixed", "16-mixed"), default="32-true")
    p.add_argument("--stateful_loader", action="store_true", help="a train loader Lightning saves and restores")
    p.add_argument("--random_collator", action="store_true", help="a collate_fn that masks tokens at random")
    p.add_argument("--warmup_steps", type=int, default=0, help="a linear warmup before the cosine schedule")
    p.add_argument("--torchdata", action="store_true", help="torchdata's StatefulDataLoader as the train loader")
    p.add_argument("--devices", type=int, default=1, help="processes: more than 1 is DDP over gloo, launched by "
                   "Lightning itself (https://lightning.ai/docs/pytorch/stable/accelerators/gpu_intermediate.html)")
    args = p.parse_args()
    L.seed_everything(0, workers=True)
    module = TinyLightning(args.dropout, args.max_steps, args.warmup_steps)
    data = torch.utils.data.TensorDataset(random_tokens())
    collate = masking_collate if args.random_collator else None
    if args.stateful_loader:  # a generator of its own for the workers' base seed too: iter() draws no global RNG
        loader = ResumableLoader(data, batch_size=BATCH, sampler=EpochSampler(len(data), 0), collate_fn=collate,
                                 num_workers=args.num_workers, generator=torch.Generator().manual_seed(0))
    elif args.torchdata:
        from torchdata.stateful_dataloader import StatefulDataLoader

        loader = StatefulDataLoader(data, batch_size=BATCH, shuffle=True, num_workers=args.num_workers,
                                    collate_fn=collate)
    else:
        loader = torch.utils.data.DataLoader(data, batch_size=BATCH, shuffle=True, num_workers=args.num_workers,
                                             collate_fn=collate)
    saver = L.pytorch.callbacks.ModelCheckpoint(args.out, filename="{step}", every_n_train_steps=args.every,
                                                save_top_k=-1, save_last=args.save_last or None)
    trainer = L.Trainer(accelerator="cpu", devices=args.devices, strategy="ddp" if args.devices > 1 else "auto",
                        max_steps=args.max_steps, max_epochs=-1, deterministic=True,
                        accumulate_grad_batches=args.accumulate_grad_batches, precision=args.precision,
                        callbacks=[saver], logger=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(module, train_dataloaders=loader, ckpt_path=args.ckpt_path)


if __name__ == "__main__":
    main()

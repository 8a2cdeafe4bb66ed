"""A Lightning script that checkpoints and resumes as the docs show: certify's example of a Lightning run.

A ModelCheckpoint every N optimizer steps (every_n_train_steps, save_top_k=-1:
https://lightning.ai/docs/pytorch/stable/common/checkpointing_intermediate.html), resumed with
trainer.fit(..., ckpt_path=...) (https://lightning.ai/docs/pytorch/stable/common/checkpointing_basic.html),
seed_everything and deterministic=True (https://lightning.ai/docs/pytorch/stable/common/trainer.html#reproducibility).
A tiny causal LM on random tokens (tiny_lm.py).
"""

import argparse

import lightning as L
import torch

from tiny_lm import TinyLM, random_tokens


class TinyLightning(L.LightningModule):
    def __init__(self, dropout: float, steps: int):
        super().__init__()
        self.lm, self.steps = TinyLM(dropout), steps

    def training_step(self, batch, batch_idx):
        return self.lm(batch[0])

    def configure_optimizers(self):
        optimizer = torch.optim.AdamW(self.parameters(), lr=3e-3)
        return {"optimizer": optimizer, "lr_scheduler": {
            "scheduler": torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, self.steps), "interval": "step"}}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="the folder of the checkpoints (step=K.ckpt)")
    p.add_argument("--ckpt_path", help="a checkpoint to resume from")
    p.add_argument("--max_steps", type=int, default=12)
    p.add_argument("--every", type=int, default=4)
    p.add_argument("--dropout", type=float, default=0.0)
    args = p.parse_args()
    L.seed_everything(0, workers=True)
    module = TinyLightning(args.dropout, args.max_steps)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(random_tokens()), batch_size=4, shuffle=True)
    saver = L.pytorch.callbacks.ModelCheckpoint(args.out, filename="{step}", every_n_train_steps=args.every,
                                                save_top_k=-1)
    trainer = L.Trainer(accelerator="cpu", devices=1, max_steps=args.max_steps, max_epochs=-1, deterministic=True,
                        callbacks=[saver], logger=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(module, train_dataloaders=loader, ckpt_path=args.ckpt_path)


if __name__ == "__main__":
    main()

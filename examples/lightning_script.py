"""A Lightning script that checkpoints and resumes as the docs show: certify's example of a Lightning run.

A ModelCheckpoint every N optimizer steps (every_n_train_steps, save_top_k=-1:
https://lightning.ai/docs/pytorch/stable/common/checkpointing_intermediate.html), resumed with
trainer.fit(..., ckpt_path=...) (https://lightning.ai/docs/pytorch/stable/common/checkpointing_basic.html),
seed_everything and deterministic=True (https://lightning.ai/docs/pytorch/stable/common/trainer.html#reproducibility).
A tiny causal LM on random tokens, so that it runs in seconds on a CPU.
"""

import argparse

import lightning as L
import torch

SAMPLES, SEQ_LEN, VOCAB = 64, 16, 97


class TinyLM(L.LightningModule):
    def __init__(self, dropout: float, steps: int):
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, 32)
        self.mix = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Dropout(dropout),
                                       torch.nn.Linear(64, 32))
        self.head = torch.nn.Linear(32, VOCAB)
        self.steps = steps

    def forward(self, tokens):
        x = self.embed(tokens[:, :-1])
        logits = self.head(x + self.mix(x))
        return torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))

    def training_step(self, batch, batch_idx):
        return self(batch[0])

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
    module = TinyLM(args.dropout, args.max_steps)
    tokens = torch.randint(0, VOCAB, (SAMPLES, SEQ_LEN), generator=torch.Generator().manual_seed(2))
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(tokens), batch_size=4, shuffle=True)
    saver = L.pytorch.callbacks.ModelCheckpoint(args.out, filename="{step}", every_n_train_steps=args.every,
                                                save_top_k=-1)
    trainer = L.Trainer(accelerator="cpu", devices=1, max_steps=args.max_steps, max_epochs=-1, deterministic=True,
                        callbacks=[saver], logger=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(module, train_dataloaders=loader, ckpt_path=args.ckpt_path)


if __name__ == "__main__":
    main()

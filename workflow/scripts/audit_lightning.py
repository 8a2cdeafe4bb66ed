"""The audit's lightning row: a LightningModule and a Trainer, resumed with trainer.fit(..., ckpt_path=...).

As the docs show it: a ModelCheckpoint every N optimizer steps
(https://lightning.ai/docs/pytorch/stable/common/checkpointing_intermediate.html, every_n_train_steps), resumed
with fit(ckpt_path=...) ("Resume training state",
https://lightning.ai/docs/pytorch/stable/common/checkpointing_basic.html), seed_everything(seed, workers=True) and
Trainer(deterministic=True) (https://lightning.ai/docs/pytorch/stable/common/trainer.html#reproducibility), and a
Callback for the per-step certificate (https://lightning.ai/docs/pytorch/stable/extensions/callbacks.html).
The plain recipe trains on a plain shuffled DataLoader; --recipe stateful is the documented fix, a train loader
with state_dict()/load_state_dict() that the fit loop saves in the checkpoint and restores mid-epoch.
"""

from pathlib import Path

import torch

from mmkit.audit import (BATCH_SIZE, GRAD_CLIP, LR, STEPS, WEIGHT_DECAY, Certificate, CutState, adapter_args,
                         build_model, collate, cosine, load_inputs, resume_failed, resume_source, run_adapter,
                         save_weights, without_optimizer_state)
from mmkit.errors import UserError

PRECISION = {"fp32": "32-true", "bf16": "bf16-mixed", "fp16": "16-mixed"}


def empty_optimizer(folder: Path) -> None:
    for path in folder.glob("*.ckpt"):
        ckpt = torch.load(path, weights_only=True)
        ckpt["optimizer_states"] = [without_optimizer_state(sd) for sd in ckpt["optimizer_states"]]
        torch.save(ckpt, path)


def plain_loader(data, scenario, seed):
    return torch.utils.data.DataLoader(data, batch_size=BATCH_SIZE, shuffle=True, num_workers=scenario.workers,
                                       collate_fn=collate)


def stateful_loader(data, scenario, seed):
    """The fix: each epoch's order from a generator of its own (seed + epoch), the position (epoch, batches
    yielded) a value Lightning saves in ckpt["loops"]["fit_loop"]["state_dict"]["combined_loader"] and loads
    back (its _Stateful protocol) before the resumed epoch's iter()."""

    class EpochSampler(torch.utils.data.Sampler):
        epoch, skip = 0, 0

        def __len__(self):
            return len(data)

        def __iter__(self):
            order = torch.randperm(len(data), generator=torch.Generator().manual_seed(seed + self.epoch))
            yield from order[self.skip:].tolist()

    class ResumableLoader(torch.utils.data.DataLoader):
        batches = 0

        def __iter__(self):
            if self.batches == len(self):  # the epoch was used up (Lightning stops at len, never at exhaustion)
                self.sampler.epoch, self.batches = self.sampler.epoch + 1, 0
            self.sampler.skip = self.batches * BATCH_SIZE
            for batch in super().__iter__():
                self.batches += 1
                yield batch

        def state_dict(self):
            return {"epoch": self.sampler.epoch, "batches": self.batches}

        def load_state_dict(self, state):
            self.sampler.epoch, self.batches = state["epoch"], state["batches"]

    # a generator of its own for the workers' base seed too: iter() then draws nothing from the global torch RNG
    return ResumableLoader(data, batch_size=BATCH_SIZE, sampler=EpochSampler(), num_workers=scenario.workers,
                           collate_fn=collate, generator=torch.Generator().manual_seed(seed))


def main():
    parser = adapter_args(__doc__)
    parser.add_argument("--recipe", choices=("plain", "stateful"), default="plain", help="the train loader")
    args = parser.parse_args()
    settings, scenario, data = load_inputs(args, "lightning")
    import lightning as L

    class AuditModule(L.LightningModule):
        def __init__(self, model):
            super().__init__()
            self.model = model

        def training_step(self, batch, batch_idx):
            return self.model(input_ids=batch["input_ids"], labels=batch["labels"])["loss"]

        def configure_optimizers(self):
            optimizer = torch.optim.AdamW(self.parameters(), lr=LR, weight_decay=WEIGHT_DECAY)
            schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, cosine)  # over STEPS, whatever max_steps
            return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}

    samples, certificate, cut = [], Certificate(), CutState(args, scenario.cut)

    class Record(L.Callback):
        def on_train_start(self, trainer, module):
            self.started = True  # past the checkpoint load: a failure from here on is not the resume's

        def on_train_batch_start(self, trainer, module, batch, batch_idx):
            if not samples:  # the step's first micro-batch
                self.step_before = trainer.global_step
                cut.at_step_start(trainer.global_step + 1)
            samples.extend(batch["idx"].tolist())

        def on_before_optimizer_step(self, trainer, module, optimizer):
            self.lr = optimizer.param_groups[0]["lr"]  # the LR this step uses

        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            if trainer.global_step > self.step_before:  # the optimizer stepped
                certificate.record(trainer.global_step, samples, self.lr, module.model, trainer.optimizers[0])
                samples.clear()

    L.seed_everything(settings.seed, workers=True)
    module = AuditModule(build_model(scenario, settings.model.vocab_size, settings.seed))
    loader = (stateful_loader if args.recipe == "stateful" else plain_loader)(data, scenario, settings.seed)
    saver = L.pytorch.callbacks.ModelCheckpoint(args.checkpoints, every_n_train_steps=scenario.cut, save_top_k=-1)
    record = Record()
    trainer = L.Trainer(
        accelerator="cpu", devices=1, max_steps=scenario.cut if args.mode == "stop" else STEPS, max_epochs=-1,
        accumulate_grad_batches=scenario.accumulation, gradient_clip_val=GRAD_CLIP,
        precision=PRECISION[scenario.precision], deterministic=True, callbacks=[record, saver], logger=False,
        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0)
    ckpt = None
    if args.mode == "resumed":
        found = sorted(resume_source(args, empty_optimizer).glob("*.ckpt"))
        if len(found) != 1:
            raise UserError(f"resume failed: {len(found)} .ckpt files in {args.resume_from}, not the stopped run's one")
        ckpt = str(found[0])
    try:
        trainer.fit(module, train_dataloaders=loader, ckpt_path=ckpt)
    except Exception as e:
        if ckpt is None or getattr(record, "started", False):
            raise
        raise resume_failed(e) from None
    certificate.save(args.certificate)
    if args.weights:
        save_weights(module.model, args.weights)


if __name__ == "__main__":
    run_adapter(main)

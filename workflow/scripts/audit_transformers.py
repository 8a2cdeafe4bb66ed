"""The audit's transformers row: Trainer, resumed with trainer.train(resume_from_checkpoint=...).

As the docs show it: https://huggingface.co/docs/transformers/en/trainer#checkpoints (save_strategy "steps",
resume_from_checkpoint), reproducibility from seed and data_seed:
https://huggingface.co/docs/transformers/en/main_classes/trainer#randomness, and a TrainerCallback for the
per-step certificate: https://huggingface.co/docs/transformers/en/main_classes/callback. The one subclass is
compute_loss, the documented hook to customize the loss, here only to take the sample ids out of the batch.
"""

from pathlib import Path

from mmkit.audit import (BATCH_SIZE, GRAD_CLIP, LR, STEPS, WEIGHT_DECAY, Certificate, CutState, adapter_args,
                         build_model, collate, emptied_optimizer_files, load_inputs, resume_failed, resume_source,
                         run_adapter, save_weights)
from mmkit.errors import UserError


empty_optimizer = emptied_optimizer_files("checkpoint-*/optimizer.pt")  # the optimizer's state_dict, saved alone


def main():
    args = adapter_args(__doc__).parse_args()
    settings, scenario, data = load_inputs(args, "transformers")
    from transformers import Trainer, TrainerCallback, TrainingArguments

    samples, certificate, cut = [], Certificate(), CutState(args, scenario.cut)

    class IdsTrainer(Trainer):
        def compute_loss(self, model, inputs, *rest, **kwargs):
            samples.extend(inputs.pop("idx").tolist())
            return super().compute_loss(model, inputs, *rest, **kwargs)

    class Record(TrainerCallback):
        def on_step_begin(self, args_, state, control, **kw):
            cut.at_step_start(state.global_step + 1)

        def on_pre_optimizer_step(self, args_, state, control, optimizer=None, **kw):
            self.lr = optimizer.param_groups[0]["lr"]  # the LR this step uses

        def on_step_end(self, args_, state, control, model=None, optimizer=None, **kw):
            certificate.record(state.global_step, samples, self.lr, model, optimizer)
            samples.clear()

        def on_save(self, args_, state, control, **kw):
            if args.mode == "stop" and state.global_step >= scenario.cut:
                control.should_training_stop = True  # stopped right after its own checkpoint at the cut

    training = TrainingArguments(
        output_dir=args.checkpoints, max_steps=STEPS, per_device_train_batch_size=BATCH_SIZE,
        gradient_accumulation_steps=scenario.accumulation, learning_rate=LR, weight_decay=WEIGHT_DECAY,
        lr_scheduler_type="cosine", warmup_steps=0, max_grad_norm=GRAD_CLIP, optim="adamw_torch",
        seed=settings.seed, data_seed=settings.seed, save_strategy="steps", save_steps=scenario.cut,
        dataloader_num_workers=scenario.workers, bf16=scenario.precision == "bf16",
        fp16=scenario.precision == "fp16", use_cpu=True,
        remove_unused_columns=False, report_to="none", logging_strategy="no", disable_tqdm=True,
    )
    model = build_model(scenario, settings.model.vocab_size, settings.seed)
    trainer = IdsTrainer(model=model, args=training, train_dataset=data, data_collator=collate, callbacks=[Record()])
    resume = None
    if args.mode == "resumed":
        found = sorted(resume_source(args, empty_optimizer).glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))
        if not found:
            raise UserError(f"resume failed: no checkpoint-* folder in {args.resume_from}")
        resume = str(found[-1])
    try:
        trainer.train(resume_from_checkpoint=resume)
    except Exception as e:  # the framework's own error at resume is the cell's result
        if resume is None:
            raise
        raise resume_failed(e) from None
    certificate.save(args.certificate)
    if args.weights:
        save_weights(model, args.weights)


if __name__ == "__main__":
    run_adapter(main)

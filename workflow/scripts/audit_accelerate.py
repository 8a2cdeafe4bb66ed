"""The audit's accelerate row: a plain loop under Accelerator, saved with save_state and resumed with load_state.

As the docs show it: https://huggingface.co/docs/accelerate/usage_guides/checkpoint (save_state, load_state,
skip_first_batches) and its example
https://github.com/huggingface/accelerate/blob/main/examples/by_feature/checkpointing.py (a folder step_{k},
the starting epoch and resume_step derived from k and len(train_dataloader), skip_first_batches in the first
resumed epoch; k counts optimizer steps, so it is k * accumulation batches, as in the no_trainer examples),
gradient accumulation with accelerator.accumulate and clipping on sync_gradients:
https://huggingface.co/docs/accelerate/usage_guides/gradient_accumulation. set_seed, a plain shuffled DataLoader.
"""

import math
from pathlib import Path

import torch

from mmkit.audit import (BATCH_SIZE, GRAD_CLIP, LR, STEPS, WEIGHT_DECAY, Certificate, CutState, adapter_args,
                         build_model, collate, cosine, emptied_optimizer_files, load_inputs, resume_failed,
                         resume_source, run_adapter, save_weights)
from mmkit.errors import UserError


empty_optimizer = emptied_optimizer_files("step_*/optimizer.bin")  # the optimizer's state_dict, saved alone


def main():
    args = adapter_args(__doc__).parse_args()
    settings, scenario, data = load_inputs(args, "accelerate")
    from accelerate import Accelerator
    from accelerate.utils import set_seed

    precision = {"bf16": "bf16", "fp16": "fp16"}.get(scenario.precision, "no")
    accelerator = Accelerator(cpu=True, mixed_precision=precision, gradient_accumulation_steps=scenario.accumulation)
    set_seed(settings.seed)
    train_dl = torch.utils.data.DataLoader(data, batch_size=BATCH_SIZE, shuffle=True, num_workers=scenario.workers,
                                           collate_fn=collate)
    model = build_model(scenario, settings.model.vocab_size, settings.seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=WEIGHT_DECAY)
    lr_scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, cosine)
    model, optimizer, train_dl, lr_scheduler = accelerator.prepare(model, optimizer, train_dl, lr_scheduler)

    step, starting_epoch, resume_step, checkpoints = 0, 0, None, Path(args.checkpoints)
    if args.mode == "resumed":
        found = sorted(resume_source(args, empty_optimizer).glob("step_*"), key=lambda p: int(p.name.split("_")[1]))
        if not found:
            raise UserError(f"resume failed: no step_* folder in {args.resume_from}")
        path = found[-1]
        try:
            accelerator.load_state(str(path))
        except Exception as e:  # only load_state is inside: any failure of it is the resume's (safetensors, pickle)
            raise resume_failed(e) from None
        step = int(path.name.split("_")[1])
        resume_step = step * scenario.accumulation
        starting_epoch = resume_step // len(train_dl)
        resume_step -= starting_epoch * len(train_dl)

    certificate, cut, samples = Certificate(), CutState(args, scenario.cut), []
    last = scenario.cut if args.mode == "stop" else STEPS
    num_epochs = math.ceil(STEPS * scenario.accumulation / len(train_dl))
    for epoch in range(starting_epoch, num_epochs):
        model.train()
        if epoch == starting_epoch and resume_step is not None:
            active_dl = accelerator.skip_first_batches(train_dl, resume_step)
        else:
            active_dl = train_dl
        for batch in active_dl:
            if not samples:  # the first micro-batch of an optimizer step
                cut.at_step_start(step + 1)
                lr = optimizer.param_groups[0]["lr"]  # the LR this step uses
            samples += batch.pop("idx").tolist()
            with accelerator.accumulate(model):
                loss = model(input_ids=batch["input_ids"], labels=batch["labels"])["loss"]
                accelerator.backward(loss)
                if accelerator.sync_gradients:
                    accelerator.clip_grad_norm_(model.parameters(), GRAD_CLIP)
                optimizer.step()
                lr_scheduler.step()
                optimizer.zero_grad()
            if accelerator.sync_gradients:
                step += 1
                certificate.record(step, samples, lr, model, optimizer)
                samples = []
                if args.mode == "stop" and step == scenario.cut:
                    accelerator.save_state(str(checkpoints / f"step_{step}"))
                if step == last:
                    break
        if step == last:
            break
    certificate.save(args.certificate)
    if args.weights:
        save_weights(accelerator.unwrap_model(model), args.weights)


if __name__ == "__main__":
    run_adapter(main)

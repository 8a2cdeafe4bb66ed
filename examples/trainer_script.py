"""A transformers Trainer script that checkpoints and resumes as the docs show: certify's example of a
Trainer run (python examples/trainer_script.py, or under torchrun / accelerate launch: DDP over gloo).

https://huggingface.co/docs/transformers/en/trainer#checkpoints: save_strategy "steps", and
trainer.train(resume_from_checkpoint=...) to continue; https://huggingface.co/docs/transformers/en/main_classes/trainer#randomness:
seed and data_seed. The options after --dropout are TrainingArguments' own (gradient accumulation, DataLoader
workers, bf16 / fp16 mixed precision). A tiny Llama on random tokens, so that it runs in seconds on a CPU.
"""

import argparse

import torch
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments

from tiny_lm import SEQ_LEN, VOCAB, random_mask, random_tokens


class RandomTokens(torch.utils.data.Dataset):
    def __init__(self):
        self.tokens = random_tokens()

    def __len__(self):
        return len(self.tokens)

    def __getitem__(self, i):
        return {"input_ids": self.tokens[i], "labels": self.tokens[i]}


def masking_collator(items: list) -> dict:
    """A data_collator that draws random numbers, as masking and augmentation do: the inputs masked at random
    (https://huggingface.co/docs/transformers/en/main_classes/data_collator: any callable on a list of items)."""
    input_ids = torch.stack([item["input_ids"] for item in items])
    return {"input_ids": random_mask(input_ids), "labels": input_ids}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--output_dir", required=True)
    p.add_argument("--resume_from_checkpoint", help="a checkpoint-<step> folder, or true: the newest in --output_dir "
                   "(resume_from_checkpoint=True, Trainer's own auto-resume)")
    p.add_argument("--max_steps", type=int, default=12)
    p.add_argument("--save_steps", type=int, default=4)
    p.add_argument("--dropout", type=float, default=0.0)
    p.add_argument("--gradient_accumulation_steps", type=int, default=1)
    p.add_argument("--dataloader_num_workers", type=int, default=0)
    p.add_argument("--bf16", action="store_true")
    p.add_argument("--fp16", action="store_true")
    p.add_argument("--random_collator", action="store_true", help="a data_collator that masks tokens at random")
    p.add_argument("--warmup_steps", type=int, default=0, help="a linear warmup before the cosine schedule")
    args = p.parse_args()
    training = TrainingArguments(
        output_dir=args.output_dir, max_steps=args.max_steps, save_strategy="steps", save_steps=args.save_steps,
        per_device_train_batch_size=4, learning_rate=3e-3, lr_scheduler_type="cosine", seed=0, data_seed=0,
        gradient_accumulation_steps=args.gradient_accumulation_steps,
        dataloader_num_workers=args.dataloader_num_workers, bf16=args.bf16, fp16=args.fp16,
        warmup_steps=args.warmup_steps,
        use_cpu=True, report_to="none", logging_strategy="no", disable_tqdm=True,
    )
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=SEQ_LEN,
                         attention_dropout=args.dropout)
    trainer = Trainer(model=LlamaForCausalLM(config), args=training, train_dataset=RandomTokens(),
                      data_collator=masking_collator if args.random_collator else None)
    resume = args.resume_from_checkpoint
    trainer.train(resume_from_checkpoint=True if resume == "true" else resume)


if __name__ == "__main__":
    main()

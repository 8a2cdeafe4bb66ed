"""What the examples train: a tiny causal LM on random tokens, so that each runs in seconds on a CPU."""

import torch

SAMPLES, SEQ_LEN, VOCAB = 32, 16, 97  # 8 batches of 4: an epoch


class TinyLM(torch.nn.Module):
    """Embeddings, a residual MLP with dropout, a head; called on a batch of token rows, returns the loss."""

    def __init__(self, dropout: float = 0.0):
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, 32)
        self.mix = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Dropout(dropout),
                                       torch.nn.Linear(64, 32))
        self.head = torch.nn.Linear(32, VOCAB)

    def forward(self, tokens):
        x = self.embed(tokens[:, :-1])
        logits = self.head(x + self.mix(x))
        return torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))


def random_tokens() -> torch.Tensor:
    """SAMPLES rows of SEQ_LEN tokens, the same in every process (a generator of their own)."""
    return torch.randint(0, VOCAB, (SAMPLES, SEQ_LEN), generator=torch.Generator().manual_seed(2))


def random_mask(tokens: torch.Tensor) -> torch.Tensor:
    """A collator's random draw, as masking and augmentation make: about 15% of the tokens set to 0, drawn
    from the global torch RNG (in the main process, or in a DataLoader worker)."""
    return tokens.masked_fill(torch.rand(tokens.shape) < 0.15, 0)


def masking_collate(items: list) -> list:
    """A DataLoader collate_fn for rows of a TensorDataset, each batch masked by random_mask."""
    return [random_mask(torch.stack([row for (row,) in items]))]


def warmup_cosine(optimizer, steps: int, warmup: int):
    """torch's LR schedulers chained as their docs show: a linear warmup over WARMUP steps (from a tenth of
    the LR), then cosine to the end; cosine alone without a warmup.
    https://docs.pytorch.org/docs/stable/generated/torch.optim.lr_scheduler.SequentialLR.html"""
    cosine = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, steps - warmup)
    if not warmup:
        return cosine
    linear = torch.optim.lr_scheduler.LinearLR(optimizer, start_factor=0.1, total_iters=warmup)
    return torch.optim.lr_scheduler.SequentialLR(optimizer, [linear, cosine], milestones=[warmup])

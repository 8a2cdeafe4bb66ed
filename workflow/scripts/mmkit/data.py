"""Corpus -> byte-level BPE tokenizer -> uint16 token files -> random training windows."""

import json
from pathlib import Path

import numpy as np
import torch

from .errors import UserError

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]  # MiniMind's


def read_corpus(corpus: str | None) -> list[str]:
    """Documents of the corpus: CPython's pydoc topics when corpus is None, else a .jsonl or .txt file."""
    if corpus is None:
        try:
            from pydoc_data.topics import topics
        except ImportError:
            raise UserError(
                "this Python has no pydoc_data module; set data.corpus to a .txt or .jsonl file"
            ) from None
        return [topics[k] for k in sorted(topics)]
    path = Path(corpus)
    if not path.is_file():
        raise UserError(f"data.corpus {corpus} does not exist")
    if path.suffix == ".jsonl":
        docs = []
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if not line.strip():
                continue
            try:
                docs.append(json.loads(line)["text"])
            except (json.JSONDecodeError, KeyError, TypeError):
                raise UserError(f'data.corpus {corpus} line {n} is not {{"text": ...}}') from None
    else:
        docs = [d for d in path.read_text(encoding="utf-8").split("\n\n") if d.strip()]
    if not docs:
        raise UserError(f"data.corpus {corpus} holds no text")
    return docs


def train_tokenizer(docs: list[str], vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(docs, trainer)
    return tok


def encode_corpus(tok, docs: list[str]) -> np.ndarray:
    eot = tok.token_to_id("<|endoftext|>")
    ids = []
    for enc in tok.encode_batch(docs):
        ids.extend(enc.ids)
        ids.append(eot)
    return np.asarray(ids, dtype=np.uint16)


def split_tokens(ids: np.ndarray, val_fraction: float) -> tuple[np.ndarray, np.ndarray]:
    """Hold out the tail of the corpus for validation, so val text is never trained on."""
    n_val = max(1, int(len(ids) * val_fraction))
    return ids[:-n_val], ids[-n_val:]


def load_tokens(path, vocab_size: int, min_len: int, what: str = "token file") -> np.ndarray:
    """A 1-D integer token array from .npy, checked against the model; memory-mapped, not copied."""
    try:
        arr = np.load(path, mmap_mode="r", allow_pickle=False)
    except FileNotFoundError:
        raise UserError(f"{what} {path} does not exist") from None
    except (ValueError, OSError) as e:
        raise UserError(f"{what} {path} is not a .npy array ({str(e).splitlines()[0]})") from None
    if arr.ndim != 1 or not np.issubdtype(arr.dtype, np.integer):
        raise UserError(f"{what} {path} must be a 1-D integer array, got shape {arr.shape} dtype {arr.dtype}")
    if len(arr) < min_len:
        raise UserError(f"{what} {path} has {len(arr)} tokens, fewer than the {min_len} one window needs")
    lo, hi = int(arr.min()), int(arr.max())
    if lo < 0 or hi >= vocab_size:
        raise UserError(f"{what} {path} holds token id {hi if hi >= vocab_size else lo}, outside 0..{vocab_size - 1} (model.vocab_size)")
    return arr


def draw_windows(n_tokens: int, batch_size: int, seq_len: int, generator: torch.Generator) -> torch.Tensor:
    """Where one batch's windows start: the only draw from the batch generator."""
    return torch.randint(0, n_tokens - seq_len - 1, (batch_size,), generator=generator)


def generator_at(seed: int, batches: int, n_tokens: int, batch_size: int, seq_len: int) -> torch.Generator:
    """The batch generator after BATCHES batches: the data position a resume file at that step must hold.

    Costs one small draw per batch and reads no tokens, so a resume file's gen_state can be checked.
    """
    generator = torch.Generator().manual_seed(seed)
    for _ in range(batches):
        draw_windows(n_tokens, batch_size, seq_len, generator)
    return generator


def get_batch(tokens: np.ndarray, batch_size: int, seq_len: int, generator: torch.Generator):
    """Random windows drawn with the run's own generator: its state IS the data position."""
    ix = draw_windows(len(tokens), batch_size, seq_len, generator)
    x = torch.stack([torch.from_numpy(tokens[i : i + seq_len].astype(np.int64)) for i in ix.tolist()])
    y = torch.stack([torch.from_numpy(tokens[i + 1 : i + 1 + seq_len].astype(np.int64)) for i in ix.tolist()])
    return x, y

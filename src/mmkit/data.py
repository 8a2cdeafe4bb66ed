"""Corpus -> byte-level BPE tokenizer -> the batches a training step reads, in one of two formats:

  windows   random windows of a uint16 token stream, drawn by the run's own generator (its state is the
            data position)
  minimind  MiniMind's pretraining data (dataset/lm_dataset.py PretrainDataset at d65ef2c): one JSONL
            document per sample, wrapped bos..eos and padded, read in an epoch permutation through a
            DataLoader (the position is the epoch and the batches of it consumed)
"""

import hashlib
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from .errors import UserError

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]  # MiniMind's
PAD, BOS, EOS = SPECIAL_TOKENS  # as MiniMind's tokenizer_config names them


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
        docs = jsonl_texts(path, "data.corpus")
    else:
        docs = [d for d in path.read_text(encoding="utf-8").split("\n\n") if d.strip()]
    if not docs:
        raise UserError(f"data.corpus {corpus} holds no text")
    return docs


def jsonl_texts(path, what: str) -> list[str]:
    """The text of each non-blank line of a {"text": ...} JSONL, every line checked."""
    out = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise UserError(f"{what} {path} line {n} is not JSON ({e.msg})") from None
            if not isinstance(record, dict) or "text" not in record:
                raise UserError(f'{what} {path} line {n} has no "text" field')
            if not isinstance(record["text"], str):
                raise UserError(f'{what} {path} line {n}: "text" is a {type(record["text"]).__name__}, not a string')
            out.append(record["text"])
    if not out:
        raise UserError(f"{what} {path} holds no documents")
    return out


def load_tokenizer(path, vocab_size: int):
    """An HF tokenizer.json that fits the model: MiniMind's special tokens present, every id < vocab_size."""
    from tokenizers import Tokenizer

    try:
        tok = Tokenizer.from_file(str(path))
    except FileNotFoundError:
        raise UserError(f"tokenizer {path} does not exist") from None
    except Exception as e:
        raise UserError(f"tokenizer {path} is not a tokenizer.json ({str(e).splitlines()[0][:120]})") from None
    missing = [t for t in SPECIAL_TOKENS if tok.token_to_id(t) is None]
    if missing:
        raise UserError(f"tokenizer {path} lacks MiniMind's special token(s) {', '.join(missing)}")
    if tok.get_vocab_size() > vocab_size:
        raise UserError(f"tokenizer {path} has {tok.get_vocab_size()} tokens, more than model.vocab_size {vocab_size}")
    return tok


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


def documents_before(tok, docs: list[str], n_tokens: int) -> list[str]:
    """The documents whose tokens (and end-of-text) lie wholly in the first N_TOKENS of encode_corpus:
    the JSONL of the minimind format holds no text of the held-out tail."""
    kept, end = [], 0
    for doc, enc in zip(docs, tok.encode_batch(docs)):
        end += len(enc.ids) + 1
        if end > n_tokens:
            break
        kept.append(doc)
    return kept


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


# --- which micro-batches each optimizer step takes --------------------------------------------------


@dataclass(frozen=True)
class StepPlan:
    """MiniMind's loop: an optimizer step every `accumulation` micro-batches, counted within an epoch, and a
    trailing step on what is left when an epoch ends mid-window. Micro-batches are numbered from 1 across
    epochs; the LR of each one comes from its number and the run's total (MiniMind's epoch * iters + step).
    batches_per_epoch is None for the windows format, which has no epochs.
    """
    accumulation: int
    batches_per_epoch: int | None = None

    def micro_batches(self, step: int) -> range:
        a, m = self.accumulation, self.batches_per_epoch
        if m is None:
            return range((step - 1) * a + 1, step * a + 1)
        epoch, window = divmod(step - 1, math.ceil(m / a))
        return range(epoch * m + window * a + 1, epoch * m + min((window + 1) * a, m) + 1)

    def consumed(self, step: int) -> int:
        """Micro-batches read by the end of optimizer step STEP (0 before the first)."""
        return self.micro_batches(step).stop - 1 if step > 0 else 0

    def position(self, consumed: int) -> dict:
        """The data position after CONSUMED micro-batches: the epoch, and the batches of it read."""
        epoch, batch = divmod(consumed, self.batches_per_epoch) if self.batches_per_epoch else (0, consumed)
        return {"epoch": epoch, "batch": batch}


# --- the windows format ----------------------------------------------------------------------------


class GeneratorState:
    """The batch generator as a piece of the resume (gen_state): the windows' data position is its state.
    The minimind format never draws from it, so there it stays the seed's."""

    def __init__(self, generator: torch.Generator):
        self.generator = generator

    def state_dict(self) -> torch.Tensor:
        return self.generator.get_state()

    def load_state_dict(self, state: torch.Tensor) -> None:
        self.generator.set_state(state)

    @staticmethod
    def check(g, saved, ctx):
        """The state the generator has after the batches this run reads by the resume's step (Expected)."""
        expected = ctx.expected.gen_state(saved["step"])
        if g.dtype != torch.uint8 or g.shape != expected.shape:
            ctx.refuse(f"is a {g.dtype} tensor of shape {list(g.shape)}, "
                       f"the batch generator's state is uint8 of shape {list(expected.shape)}")
        if not torch.equal(g, expected):
            ctx.refuse(f"is not the data position after {saved['step']} batches of this run")


class DataPosition:
    """Where the data continues, as the resume's two pieces: the position as a value, {epoch, batches of it
    read} (itself: data_position; the minimind format's whole position, its epoch order re-drawn from
    seed + epoch; with windows, epoch 0 and the batches drawn), and its generator's state (gen_state)."""

    def __init__(self, generator: torch.Generator, position: dict | None = None):
        self.generator, self.generator_state = generator, GeneratorState(generator)
        self.position = dict(position or {"epoch": 0, "batch": 0})

    def state_dict(self) -> dict:
        return dict(self.position)

    def load_state_dict(self, position: dict) -> None:
        self.position = dict(position)

    @staticmethod
    def check(position, saved, ctx):
        """The position this run reaches by the resume's step (Expected)."""
        expected = ctx.expected.position(saved["step"])
        if position != expected:
            ctx.refuse(f"is {position}; after step {saved['step']} this run reads from {expected}")


class WindowBatches(DataPosition):
    """Random windows, batch after batch, from the run's batch generator: its state is the position, which
    is also counted (epoch 0, batches drawn) so that both formats report one."""

    def __init__(self, tokens: np.ndarray, batch_size: int, seq_len: int, generator: torch.Generator):
        super().__init__(generator)
        self.tokens, self.batch_size, self.seq_len = tokens, batch_size, seq_len

    def __iter__(self):
        while True:
            batch = get_batch(self.tokens, self.batch_size, self.seq_len, self.generator)
            self.position = {"epoch": 0, "batch": self.position["batch"] + 1}
            yield batch


# --- the minimind format ---------------------------------------------------------------------------


class PretrainDataset(torch.utils.data.Dataset):
    """MiniMind's PretrainDataset on a JSONL: sample i is line i's text, tokenized without special tokens and
    cut to max_length - 2, wrapped bos + tokens + eos, padded with pad to max_length; labels -100 on the
    padding. Returns (ids[:-1], labels[1:]): the shift MiniMind's model makes inside, made here, so the
    model reads seq_len = max_length - 1 tokens as in the windows format.

    Every line is checked once when the dataset is built; a sample is tokenized only when a batch asks
    for it (in a DataLoader worker, with workers > 0).
    """

    def __init__(self, jsonl, tokenizer_path, max_length: int, vocab_size: int):
        self.jsonl, self.tokenizer_path, self.max_length = str(jsonl), str(tokenizer_path), max_length
        tok = load_tokenizer(tokenizer_path, vocab_size)
        self.pad, self.bos, self.eos = (tok.token_to_id(t) for t in (PAD, BOS, EOS))
        self.texts = jsonl_texts(jsonl, "training JSONL")
        self._tok = None  # loaded again in each worker, on first use

    def __len__(self):
        return len(self.texts)

    def __getitem__(self, i):
        if self._tok is None:
            from tokenizers import Tokenizer

            self._tok = Tokenizer.from_file(self.tokenizer_path)
        ids = self._tok.encode(self.texts[i], add_special_tokens=False).ids[: self.max_length - 2]
        ids = [self.bos] + ids + [self.eos]
        ids = torch.tensor(ids + [self.pad] * (self.max_length - len(ids)), dtype=torch.long)
        labels = ids.clone()
        labels[ids == self.pad] = -100
        return ids[:-1], labels[1:]


def seed_worker(worker_id: int) -> None:
    """A DataLoader worker's Python and NumPy RNGs from the torch seed the loader gave it (base seed from
    the loader's own generator, + worker id): anything random in a worker is reproducible."""
    import random

    seed = torch.initial_seed() % 2**32
    random.seed(seed)
    np.random.seed(seed)


class EpochBatches(DataPosition):
    """Batches of a dataset in MiniMind's order: epoch e is a permutation drawn from a generator seeded
    seed + e (MiniMind's setup_seed(42 + epoch), without touching the global RNG); consecutive batch_size
    indices make a batch, the last one of an epoch shorter. A DataLoader with `workers` processes reads them.

    The position {epoch, batch} is all a resume needs: the batches before it are skipped by index, never
    tokenized (MiniMind's SkipBatchSampler).
    """

    def __init__(self, dataset, batch_size: int, seed: int, workers: int, generator: torch.Generator):
        super().__init__(generator)  # never drawn from: its state stays the seed's
        self.dataset, self.batch_size, self.seed, self.workers = dataset, batch_size, seed, workers

    @property
    def batches_per_epoch(self) -> int:
        return math.ceil(len(self.dataset) / self.batch_size)

    def batches_of(self, epoch: int) -> list[list[int]]:
        order = torch.randperm(len(self.dataset), generator=torch.Generator().manual_seed(self.seed + epoch))
        return [order[i : i + self.batch_size].tolist() for i in range(0, len(order), self.batch_size)]

    def __iter__(self):
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # workers are forked processes
        while True:
            epoch, skip = self.position["epoch"], self.position["batch"]
            loader = torch.utils.data.DataLoader(
                self.dataset, batch_sampler=self.batches_of(epoch)[skip:], num_workers=self.workers,
                worker_init_fn=seed_worker,
                # the loader draws its workers' base seed from this, not from the global RNG (dropout's)
                generator=torch.Generator().manual_seed(self.seed + epoch))
            for batch, (x, y) in enumerate(loader, skip + 1):
                done = batch == self.batches_per_epoch
                self.position = {"epoch": epoch + done, "batch": 0 if done else batch}
                yield x, y


# --- what a resume must hold of the data ----------------------------------------------------------


class Expected:
    """What a resume of this run must hold: a step before LAST_STEP (the last this run trains), and after it
    the data position and the window generator's state, both after the batches read by then, less `lag`
    (the batches an ablation rewound). The resume's checks (mmkit.checkpoint.entries) ask it; it reads no tokens."""

    def __init__(self, plan: StepPlan, seed: int, batches, last_step: int):
        self.plan, self.seed, self.batches, self.last_step, self.lag = plan, seed, batches, last_step, 0
        self.schedule_offset = 0  # micro-batches the LR schedule is behind: the nosched ablation's shift

    def position(self, step):
        return self.plan.position(self.plan.consumed(step) - self.lag)

    def gen_state(self, step):
        b = self.batches
        if not isinstance(b, WindowBatches):  # the minimind format never draws from it
            return torch.Generator().manual_seed(self.seed).get_state()
        consumed = self.plan.consumed(step) - self.lag
        return generator_at(self.seed, consumed, len(b.tokens), b.batch_size, b.seq_len).get_state()

    def rewound_from(self, step: int, position: dict, schedule_restarted: bool = False) -> None:
        """After a resume at STEP: the ablations that shift the data position (or restart the LR schedule,
        SCHEDULE_RESTARTED) keep them shifted, after a restart too."""
        self.lag = self.plan.consumed(step) - (position["epoch"] * (self.plan.batches_per_epoch or 0)
                                               + position["batch"])
        self.schedule_offset = self.plan.consumed(step) if schedule_restarted else 0


# --- what a training job reads ---------------------------------------------------------------------


class TrainingData:
    """The training data of either format: what the fingerprint hashes, and the batches it yields."""

    def __init__(self, cfg, tokens=None, jsonl=None, tokenizer=None):
        self.cfg, self.windows = cfg, cfg.data_format == "windows"
        given = "--tokens" if tokens else "--jsonl" if jsonl else None
        if given != ("--tokens" if self.windows else "--jsonl") or (not self.windows and not tokenizer):
            raise UserError(f"data.format {cfg.data_format} trains on " + (
                "--tokens T.npy" if self.windows else "--jsonl J.jsonl --tokenizer tokenizer.json"))
        if self.windows:
            self.tokens = load_tokens(tokens, cfg.model.vocab_size, cfg.seq_len + 2, "training tokens")
            self.sha256 = hashlib.sha256(memoryview(self.tokens)).hexdigest()
            self.batches_per_epoch = None
        else:
            # a sample is MiniMind's max_length = seq_len + 1 tokens: the model reads seq_len of them
            self.dataset = PretrainDataset(jsonl, tokenizer, cfg.seq_len + 1, cfg.model.vocab_size)
            self.sha256 = hashlib.sha256(Path(jsonl).read_bytes() + Path(tokenizer).read_bytes()).hexdigest()
            self.batches_per_epoch = math.ceil(len(self.dataset) / cfg.batch_size)

    def batches(self, generator: torch.Generator, drawn: int):
        """The batches from step 1's position (a resume moves .position): windows of DRAWN drawn with
        GENERATOR, or the epochs' batches."""
        if self.windows:
            return WindowBatches(self.tokens, drawn, self.cfg.seq_len, generator)
        return EpochBatches(self.dataset, self.cfg.batch_size, self.cfg.seed, self.cfg.workers, generator)

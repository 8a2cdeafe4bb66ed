"""Corpus -> tokenizer.json, train.npy, val.npy (uint16 token ids; val is the corpus's held-out tail)."""

import argparse

import numpy as np

from mmkit.atomic import write_atomic, write_text_atomic
from mmkit.data import encode_corpus, read_corpus, split_tokens, train_tokenizer
from mmkit.config import load_config
from mmkit.errors import run_cli


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--config", required=True, help="data.corpus, data.val_fraction, model.vocab_size")
    p.add_argument("--tokenizer", required=True)
    p.add_argument("--train", required=True)
    p.add_argument("--val", required=True)
    args = p.parse_args()

    cfg = load_config(args.config)
    corpus, val_fraction, vocab_size = cfg.data.corpus, cfg.data.val_fraction, cfg.model.vocab_size

    docs = read_corpus(corpus)  # None: CPython's pydoc_data topics
    tokenizer = train_tokenizer(docs, vocab_size)
    train, val = split_tokens(encode_corpus(tokenizer, docs), val_fraction)
    print(f"{len(docs)} documents, vocab {tokenizer.get_vocab_size()}, {len(train)} train / {len(val)} val tokens")

    write_text_atomic(args.tokenizer, tokenizer.to_str())
    for path, arr in ((args.train, train), (args.val, val)):
        write_atomic(path, lambda f, arr=arr: np.save(f, arr, allow_pickle=False))


if __name__ == "__main__":
    run_cli(main)

"""Corpus -> tokenizer.json, train.npy, val.npy (uint16 token ids; val is the corpus's held-out tail)."""

import argparse

import numpy as np

from mmkit.atomic import write_atomic, write_text_atomic
from mmkit.data import encode_corpus, read_corpus, split_tokens, train_tokenizer
from mmkit.errors import run_cli


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--corpus", default="", help=".jsonl or .txt; empty = CPython's pydoc_data topics")
    p.add_argument("--vocab-size", type=int, required=True)
    p.add_argument("--val-fraction", type=float, required=True)
    p.add_argument("--tokenizer", required=True)
    p.add_argument("--train", required=True)
    p.add_argument("--val", required=True)
    args = p.parse_args()

    docs = read_corpus(args.corpus or None)
    tokenizer = train_tokenizer(docs, args.vocab_size)
    train, val = split_tokens(encode_corpus(tokenizer, docs), args.val_fraction)
    print(f"{len(docs)} documents, vocab {tokenizer.get_vocab_size()}, {len(train)} train / {len(val)} val tokens")

    write_text_atomic(args.tokenizer, tokenizer.to_str())
    for path, arr in ((args.train, train), (args.val, val)):
        write_atomic(path, lambda f, arr=arr: np.save(f, arr, allow_pickle=False))


if __name__ == "__main__":
    run_cli(main)

"""Corpus -> tokenizer.json, train.npy, val.npy (uint16 token ids; val is the corpus's held-out tail) and
train.jsonl (the documents wholly before that tail, one {"text": ...} per line: the minimind format's data).
"""

import argparse
import json

import numpy as np

from mmkit.atomic import write_atomic, write_text_atomic
from mmkit.config import load_config
from mmkit.data import documents_before, encode_corpus, load_tokenizer, read_corpus, split_tokens, train_tokenizer
from mmkit.errors import run_cli


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--config", required=True, help="data.corpus, data.val_fraction, data.tokenizer, model.vocab_size")
    p.add_argument("--tokenizer", required=True)
    p.add_argument("--train", required=True)
    p.add_argument("--val", required=True)
    p.add_argument("--jsonl", required=True)
    args = p.parse_args()

    cfg = load_config(args.config)
    corpus, val_fraction, vocab_size = cfg.data.corpus, cfg.data.val_fraction, cfg.model.vocab_size

    docs = read_corpus(corpus)  # None: CPython's pydoc_data topics
    # the user's tokenizer (MiniMind's own, say) if named, else a BPE trained on the corpus
    given = cfg.data.tokenizer
    tokenizer = load_tokenizer(given, vocab_size) if given else train_tokenizer(docs, vocab_size)
    train, val = split_tokens(encode_corpus(tokenizer, docs), val_fraction)
    train_docs = documents_before(tokenizer, docs, len(train))
    print(f"{len(docs)} documents, vocab {tokenizer.get_vocab_size()}, {len(train)} train / {len(val)} val tokens; "
          f"{len(train_docs)} documents in {args.jsonl}")

    write_text_atomic(args.tokenizer, tokenizer.to_str())
    for path, arr in ((args.train, train), (args.val, val)):
        write_atomic(path, lambda f, arr=arr: np.save(f, arr, allow_pickle=False))
    write_text_atomic(args.jsonl, "".join(json.dumps({"text": d}, ensure_ascii=False) + "\n" for d in train_docs))


if __name__ == "__main__":
    run_cli(main)

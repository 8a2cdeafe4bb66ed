"""Export a weights file for inference: a directory transformers.LlamaForCausalLM.from_pretrained reads.

Writes OUTDIR/model.safetensors (fp16, the tied lm_head left to tie_word_embeddings) and
OUTDIR/config.json; the resume file stays what it is, fp32 and ours.
"""

import argparse

from mmkit.checkpoint.files import load_weights
from mmkit.config import load_config, model_config
from mmkit.errors import run_cli
from mmkit.export import write_inference_dir
from mmkit.model import MiniMindForCausalLM


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--config", required=True)
    p.add_argument("--weights", required=True, help="fp32 weights file (straight.pth)")
    p.add_argument("--outdir", required=True, help="directory for model.safetensors and config.json")
    args = p.parse_args()

    arch = model_config(load_config(args.config))
    # checked key by key and shape by shape against the model the config describes
    sd = load_weights(args.weights, MiniMindForCausalLM(arch))
    write_inference_dir(args.outdir, arch, sd)
    print(f"wrote {args.outdir}/model.safetensors and {args.outdir}/config.json")


if __name__ == "__main__":
    run_cli(main)

rule resolved_config:
    output:
        RESOLVED_CONFIG,
    log:
        f"{OUT}/logs/resolved_config.log",
    conda:
        ENV
    params:
        config=config,
    script:
        "../scripts/write_config.py"


rule tokenize:
    input:
        code=package("data", "checkpoint"),
        script=SCRIPTS / "prepare_data.py",
    output:
        tokenizer=f"{OUT}/data/tokenizer.json",
        train=f"{OUT}/data/train.npy",
        val=f"{OUT}/data/val.npy",
    log:
        f"{OUT}/logs/tokenize.log",
    conda:
        ENV
    params:
        corpus=config["data"]["corpus"] or "",
        vocab_size=config["model"]["vocab_size"],
        val_fraction=config["data"]["val_fraction"],
    shell:
        "python {input.script} --corpus '{params.corpus}' --vocab-size {params.vocab_size}"
        " --val-fraction {params.val_fraction} --tokenizer {output.tokenizer}"
        " --train {output.train} --val {output.val} 2> {log}"

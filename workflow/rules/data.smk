rule resolved_config:
    output:
        RESOLVED_CONFIG,
    params:
        config=config,
    log:
        f"{OUT}/logs/resolved_config.log",
    run:
        import yaml
        from mmkit.checkpoint import write_text_atomic

        write_text_atomic(output[0], yaml.safe_dump(dict(params.config), sort_keys=False))


rule tokenize:
    input:
        code=package("data", "checkpoint"),
        script=SCRIPTS / "prepare_data.py",
    output:
        tokenizer=f"{OUT}/data/tokenizer.json",
        train=f"{OUT}/data/train.npy",
        val=f"{OUT}/data/val.npy",
    params:
        corpus=config["data"]["corpus"] or "",
        vocab_size=config["model"]["vocab_size"],
        val_fraction=config["data"]["val_fraction"],
    log:
        f"{OUT}/logs/tokenize.log",
    shell:
        "python {input.script} --corpus '{params.corpus}' --vocab-size {params.vocab_size}"
        " --val-fraction {params.val_fraction} --tokenizer {output.tokenizer}"
        " --train {output.train} --val {output.val} 2> {log}"

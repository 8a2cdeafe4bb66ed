# The corpus as tokens: the tokenizer, the train and val token files, and MiniMind's JSONL documents.


rule tokenize:
    input:
        code=code_inputs(SCRIPTS / "prepare_data.py"),
        script=SCRIPTS / "prepare_data.py",
        settings=settings("tokenize"),
        # the user's tokenizer.json (data.tokenizer), when named: its content, not only its name, matters
        given=config["data"]["tokenizer"] or [],
    output:
        tokenizer=f"{OUT}/data/tokenizer.json",
        train=f"{OUT}/data/train.npy",
        val=f"{OUT}/data/val.npy",
        jsonl=f"{OUT}/data/train.jsonl",
    log:
        f"{OUT}/logs/tokenize.log",
    conda:
        ENV
    resources:
        **ANALYSIS_RESOURCES,
    shell:
        "python {input.script} --config {input.settings} --tokenizer {output.tokenizer}"
        " --train {output.train} --val {output.val} --jsonl {output.jsonl} 2> {log}"

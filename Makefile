# Two commands on a fresh machine:
#   make results   set up .venv with requirements.txt and build every artifact (snakemake --cores all --quiet rules)
#   make test      set up .venv with requirements-test.txt and run the tests (all but the slow tier)
#   make test-slow the slow tier: the heavy integrations (CI runs make test, make test-slow, make mutants)
#   make audit     add requirements-audit.txt (the trainers: transformers, Accelerate, Lightning) and run the audit
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
RUN := PATH=$(abspath $(BIN)):$$PATH

.PHONY: results audit site test test-slow check test-stress mutants lint readme bench bench-crash clean

$(BIN)/.runtime: requirements.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q -r requirements.txt
	touch $@

$(BIN)/.audit: requirements-audit.txt $(BIN)/.runtime
	$(BIN)/pip install -q -r requirements-audit.txt
	touch $@

$(BIN)/.test: requirements-test.txt $(BIN)/.audit
	$(BIN)/pip install -q -r requirements-test.txt
	touch $@

# snakemake's progress lines, not each job's list of inputs: the full log of each job is in results/logs/
results: $(BIN)/.runtime
	$(RUN) snakemake --cores all --quiet rules

# other trainers' resume through certify (results/audit/); the only target that needs their packages
audit: $(BIN)/.audit
	$(RUN) snakemake --cores 2 audit

# the audit as a static site (results/site/index.html, opens from disk): the audit's cells and the releases'
site: $(BIN)/.audit
	$(RUN) snakemake --cores 2 site

# three workers on two cores: the SLURM and kill tests spend their first minutes waiting (on SLURM's polling,
# on processes killed and restarted), and a third worker takes the core they leave idle (conftest.py: the order)
TEST_WORKERS ?= 3
PYTEST := PYTHONPATH=tests python -m pytest -q -rs -p outcomes -n $(TEST_WORKERS) --dist loadgroup --no-loadscope-reorder --rootdir .
# .test-record/: which tree ran, how each test ended, where its tiny pipeline is (make mutants reuses them)
RECORD := MMKIT_MUTANTS_OUTCOMES=$(abspath .test-record)/outcomes.jsonl
# the README's test command: every test but the slow tier's, in about ten minutes on two cores
test: $(BIN)/.test
	$(RUN) MMKIT_TEST_RECORD=$(abspath .test-record) $(RECORD) $(PYTEST) -m "not slow" --durations=12 tests certify/tests

# the slow tier (tests marked slow: the trainers' imports, SLURM, snakemake killed again and again, the rebuilds,
# trl sft, a browser): what CI runs after make test; its outcomes join make test's record, its pipeline is reused
test-slow: $(BIN)/.test
	mkdir -p .test-record
	$(RUN) MMKIT_TEST_RECORD_FROM=$(abspath .test-record) $(RECORD) $(PYTEST) -m slow --durations=12 tests certify/tests

# the quick tier, after every change: the in-process checks and the fastest real-process test of each command
# line (tests marked quick; no tiny pipeline build). make test is still what says a change is done
check: $(BIN)/.test
	$(RUN) PYTHONPATH=tests python -m pytest -q -rs -p outcomes -m quick -n 2 --durations=5 tests

# the suite under load: twice make test's workers, so every test gets about half the CPU it gets in make test
# (a busy CI machine's share); a test that assumes how far a job gets in some time fails here
test-stress:
	$(MAKE) test TEST_WORKERS=$$(( 2 * $(TEST_WORKERS) ))

# break the code on purpose, one named breakage at a time: each must make a test fail (a few minutes)
mutants: $(BIN)/.test
	$(RUN) python tests/mutants.py

lint: $(BIN)/.test
	$(RUN) snakemake --lint
	$(RUN) snakefmt --check Snakefile workflow/rules

# copy the default run's results tables and the latest benchmark targets into README.md and docs/*.md
# (each block lives in one of them; update_readme.py finds which)
readme: results $(BIN)/.audit
	$(RUN) snakemake --cores all dist
	$(RUN) snakemake --cores all --configfile config.yaml presets/minimind-parity.yaml
	$(RUN) snakemake --cores all audit audit_releases crash certify
	$(BIN)/python workflow/scripts/update_readme.py README.md docs/*.md results=results/summary.md \
		settings=results/settings.md dist=results/dist/summary.md bench=bench/targets.md \
		parity=results/minimind-parity/summary.md audit=results/audit/summary.md crash=results/crash/states.md \
		certify=results/certify/summary.md releases=results/audit/releases.md \
		entries=results/resume_entries.md crash_frameworks=bench/crash_frameworks.md

# the benchmark (minutes; run it on a quiet machine): bench/results.md, results.csv, targets.md
bench: $(BIN)/.test
	$(BIN)/python bench/bench.py --out-csv bench/results.csv --out-md bench/results.md --out-targets bench/targets.md
	OMP_NUM_THREADS=1 $(BIN)/torchrun --standalone --nproc-per-node 2 bench/async_save.py --out bench/async_save.md

# certify --crash beside ckpt-chaos (installed for it alone, into .venv/ckpt-chaos) on the same commands:
# saver.py's save styles and the audit's crash cells' Trainer and Lightning commands
bench-crash: $(BIN)/.test
	$(RUN) python bench/crash_side_by_side.py

clean:
	rm -rf results .snakemake

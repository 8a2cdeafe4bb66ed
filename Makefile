# Two commands on a fresh machine:
#   make results   set up .venv and build every artifact (snakemake --cores all)
#   make test      set up .venv and run the tests
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: results test lint readme bench clean

$(BIN)/.installed: requirements.txt requirements-test.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q -r requirements-test.txt
	touch $@

results: $(BIN)/.installed
	PATH=$(abspath $(BIN)):$$PATH snakemake --cores all

test: $(BIN)/.installed
	PATH=$(abspath $(BIN)):$$PATH python -m pytest -q tests

lint: $(BIN)/.installed
	PATH=$(abspath $(BIN)):$$PATH snakemake --lint
	PATH=$(abspath $(BIN)):$$PATH snakefmt --check Snakefile workflow/rules

clean:
	rm -rf results .snakemake

# copy the default run's results table and the latest benchmark targets into README.md
readme: results
	$(BIN)/python workflow/scripts/update_readme.py README.md results=results/summary.md bench=bench/targets.md

# the benchmark (minutes; run it on a quiet machine): bench/results.md, results.csv, targets.md
bench: $(BIN)/.installed
	$(BIN)/python bench/bench.py --out-csv bench/results.csv --out-md bench/results.md --out-targets bench/targets.md

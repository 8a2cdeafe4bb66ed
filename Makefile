# Two commands on a fresh machine:
#   make results   set up .venv and build every artifact (snakemake --cores all)
#   make test      set up .venv and run the tests
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: results test lint readme clean

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

# copy the default run's results table into README.md
readme: results
	$(BIN)/python workflow/scripts/update_readme.py results/summary.md README.md

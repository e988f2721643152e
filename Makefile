# Two entry points for a fresh machine (see README):
#   make demo   -> create .venv, fetch pinned assets, export + validate + run the tiny default bundle
#   make test   -> create .venv, fetch pinned assets, lint, type-check, run the test suite
PYTHON ?= python3.11
VENV   ?= .venv
BIN    := $(VENV)/bin
BUNDLES ?= bundles

.PHONY: venv assets demo test lint slow clean

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# torch first and pinned: the CPU wheel (an unpinned torch pulls a multi-GB CUDA build)
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[all,dev]'
	touch $@

venv: $(BIN)/.installed

assets: venv
	$(BIN)/omnidraft assets fetch

demo: assets
	$(BIN)/omnidraft presets
	for backend in xnnpack qnn onnx; do \
	  $(BIN)/omnidraft-export --target tiny-llama3-8b --drafter tiny-llama-68m \
	    --backend $$backend --out $(BUNDLES)/tiny-llama3-8b-$$backend || exit 1; \
	done
	$(BIN)/omnidraft validate $(BUNDLES)/tiny-llama3-8b-xnnpack $(BUNDLES)/tiny-llama3-8b-onnx
	# the QDQ graph on ORT-CPU here; on the x86 HTP simulator (--provider qnn, the default for qnn
	# bundles) one target call takes ~0.9 s, so that check runs in the tests on a shorter prompt set
	$(BIN)/omnidraft validate --provider cpu $(BUNDLES)/tiny-llama3-8b-qnn
	$(BIN)/omnidraft run $(BUNDLES)/tiny-llama3-8b-onnx --max-new-tokens 24
	$(BIN)/omnidraft bench --target tiny-llama3-8b --drafter tiny-llama-68m --max-new-tokens 24

lint: venv
	$(BIN)/ruff check .
	$(BIN)/mypy

test: assets lint
	$(BIN)/pytest

slow: assets
	$(BIN)/omnidraft assets fetch --models
	$(BIN)/pytest -m slow

clean:
	rm -rf $(VENV) $(BUNDLES) build dist *.egg-info

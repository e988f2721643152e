# Two entry points for a fresh machine (see README):
#   make demo   -> create .venv, fetch pinned assets, train (once, cached) the small default pair,
#                  export + validate + run its ONNX bundle, benchmark it (make demo-backends: all
#                  three backends on the tiny twins)
#   make test   -> create .venv, fetch pinned assets, lint, type-check, run the test suite
PYTHON ?= python3.11
VENV   ?= .venv
BIN    := $(VENV)/bin
BUNDLES ?= bundles

.PHONY: venv assets java-deps demo demo-backends test lint slow clean reports

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

# The default pair is trained here (distill/pretrain.py) on the offline corpus on first use and
# cached under ~/.cache/omnidraft-deploy/pretrained: so the text is readable and the drafter is
# accepted. The target trains first; the drafter then also learns the target's own greedy text
# (sequence-level KD, distill/seqkd.py). The random-weight tiny-* twins stay for the fast tests.
DEMO_TARGET  ?= trained-llama3-demo
DEMO_DRAFTER ?= trained-llama2-demo
DEMO_PROMPT  ?= Question: Tom has 3 apples and buys 5 more. How many apples does he have?
DEMO         := $(BUNDLES)/demo

demo: assets
	@mkdir -p $(BUNDLES) && date +%s > $(BUNDLES)/.demo-start
	$(BIN)/omnidraft presets
	$(BIN)/omnidraft-export --target $(DEMO_TARGET) --drafter $(DEMO_DRAFTER) --backend onnx \
	  --out $(DEMO)-onnx
	$(BIN)/omnidraft validate $(DEMO)-onnx
	$(BIN)/omnidraft run $(DEMO)-onnx --prompt "$(DEMO_PROMPT)" --max-new-tokens 48 --stats
	$(BIN)/omnidraft bench --target $(DEMO_TARGET) --drafter $(DEMO_DRAFTER) --max-new-tokens 32
	@echo "make demo: done in $$(( $$(date +%s) - $$(cat $(BUNDLES)/.demo-start) )) s (after the venv)"
	@echo "next: omnidraft adapt $(DEMO)-onnx (online adaptation to the prompt set; minutes), make demo-backends"

# every backend on the random-weight tiny twins (export parity, validate; fast)
demo-backends: assets
	for backend in xnnpack qnn onnx; do \
	  $(BIN)/omnidraft-export --target tiny-llama3-8b --drafter tiny-llama-68m \
	    --backend $$backend --out $(BUNDLES)/tiny-llama3-8b-$$backend || exit 1; \
	done
	$(BIN)/omnidraft validate $(BUNDLES)/tiny-llama3-8b-xnnpack $(BUNDLES)/tiny-llama3-8b-onnx
	# the QDQ graph on ORT-CPU here; on the x86 HTP simulator (--provider qnn, the default for qnn
	# bundles) one target call takes ~0.9 s, so that check runs in the tests on a shorter prompt set
	$(BIN)/omnidraft validate --provider cpu $(BUNDLES)/tiny-llama3-8b-qnn

lint: venv
	$(BIN)/ruff check .
	$(BIN)/mypy

# The Android demo's plain-Java tests need javac 17 (present) and Debian's junit4: installed here
# when we are root with apt-get, else those tests skip with the install command.
java-deps:
	@[ -f /usr/share/java/junit4.jar ] || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null \
	  && (apt-get update -qq && apt-get install -y -qq junit4 >/dev/null); } \
	  || echo "junit4 unavailable: the Android Java tests will skip (apt-get install -y junit4)"

test: assets lint java-deps
	$(BIN)/pytest

slow: assets
	$(BIN)/omnidraft assets fetch --models
	$(BIN)/pytest -m slow

# re-render reports/<benchmark>/*.md and *.png from the JSON beside them (benchmarks/render_reports.py;
# it lists the reports it keeps as written). Needs only the venv's matplotlib.
reports: venv
	$(BIN)/python -m benchmarks.render_reports

clean:
	rm -rf $(VENV) $(BUNDLES) build dist *.egg-info

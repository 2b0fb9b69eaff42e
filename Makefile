# sglang-iso: `make demo` and `make test` install into .venv when needed.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.sglang-iso-installed

.PHONY: install demo test test-fast test-extended lint clean image image-gpu
IMAGE ?= ghcr.io/example/sglang-iso
VERSION ?= 0.1.0

install: $(STAMP)

$(STAMP): requirements/runtime.txt requirements/dev.txt requirements/deploy.txt pyproject.toml testing/pyproject.toml \
		scripts/install.sh
	VENV=$(VENV) bash scripts/install.sh
	touch $(STAMP)

demo: install
	$(PY) -m sglang_iso_testing.demo

test: install
	$(PY) -m pytest

test-fast: install
	$(PY) -m pytest -m "not e2e and not extended"

test-extended: install
	$(PY) -m pytest -m extended

lint: install
	$(VENV)/bin/ruff check python testing test scripts benchmark examples sgl-kernel-patches
	$(VENV)/bin/mypy

image:
	docker build -t $(IMAGE):$(VERSION) .

image-gpu:
	docker build -t $(IMAGE):$(VERSION)-cuda --build-arg BASE_IMAGE=python:3.12.12-slim-bookworm \
		--build-arg RUNTIME_REQUIREMENTS=requirements/cuda.txt --build-arg TORCH_INDEX_URL=https://pypi.org/simple .

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache

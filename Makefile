# sglang-iso: `make demo` and `make test` install into .venv when needed.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.sglang-iso-installed

.PHONY: install demo test test-fast lint clean

install: $(STAMP)

$(STAMP): requirements/runtime.txt requirements/dev.txt requirements/deploy.txt pyproject.toml scripts/install.sh
	VENV=$(VENV) bash scripts/install.sh
	touch $(STAMP)

demo: install
	$(PY) -m sglang_iso_testing.demo

test: install
	$(PY) -m pytest

test-fast: install
	$(PY) -m pytest -m "not e2e"

lint: install
	$(VENV)/bin/ruff check python test scripts benchmark examples sgl-kernel-patches
	$(VENV)/bin/mypy

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache

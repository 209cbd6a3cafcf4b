# Two commands set everything up on a fresh machine: `make run` and `make test`.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
PYTEST_ARGS ?=

.PHONY: run test bench lint sysdeps venv clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

# Installs the Debian packages later parts need when they are missing and we are root.
sysdeps:
	@bash scripts/install-system-deps

# `make run HTTP=0.0.0.0:8080 ARGS="--config gateway.toml"`: the bind address and any other options.
HTTP ?=
ARGS ?=
run: $(STAMP)
	$(VENV)/bin/fjords-gateway run $(if $(HTTP),--http $(HTTP)) $(ARGS)

test: $(STAMP) sysdeps
	@$(PY) -m pytest $(PYTEST_ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "make test: pytest collected no tests" >&2; exit 1; fi; \
	exit $$rc

bench: $(STAMP)
	$(PY) -m benchmarks

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache

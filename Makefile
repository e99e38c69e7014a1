PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test test-slow bench soak clean

DURATION ?= 600
WORKERS  ?= 16

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/python -m gitlease.demo

test: $(STAMP)
	$(BIN)/python -m pytest -q

test-slow: $(STAMP)
	$(BIN)/python -m pytest -q -m slow

bench: $(STAMP)
	$(BIN)/python bench/run.py --write docs/performance.md
	$(BIN)/python bench/hooks.py --write docs/performance.md
	$(BIN)/python bench/plan.py --write docs/performance.md
	$(BIN)/python bench/fleet.py --write docs/performance.md

soak: $(STAMP)
	$(BIN)/python -m soak.run --duration $(DURATION) --workers $(WORKERS) --write docs/reliability.md

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache

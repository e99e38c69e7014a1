PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test test-slow test-agents fuzz test-stress check bench soak fleet-soak clean

DURATION ?= 600
WORKERS  ?= 16
# test processes (pytest-xdist): the tests mostly wait on git, so 4 suit 2 cores
JOBS     ?= 4

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test,check]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/python -m gitlease.demo

test: $(STAMP)
	$(BIN)/python -m pytest -q -n $(JOBS)

# the long races and soaks (marked slow), and the long fuzz profile; the default run keeps a short case of each
test-slow: $(STAMP)
	$(BIN)/python -m pytest -q -n $(JOBS) -m slow

# the real coding-agent clients, from the npm registry, in a cache folder (not part of make test: it downloads)
AGENT_CLIENTS ?= $(HOME)/.cache/gitlease/agent-clients
AGENT_PACKAGES ?= @anthropic-ai/claude-code@2.1.332 @openai/codex@0.171.0 @google/gemini-cli@0.61.0 @modelcontextprotocol/inspector@2.12.0
test-agents: $(STAMP)
	mkdir -p $(AGENT_CLIENTS) && cd $(AGENT_CLIENTS) && { test -f package.json || echo '{"private": true}' > package.json; } \
		&& npm install --no-audit --no-fund --loglevel=error $(AGENT_PACKAGES)
	GITLEASE_AGENT_CLIENTS=$(AGENT_CLIENTS) GITLEASE_AGENT_COST=$(AGENT_CLIENTS)/cost.json \
		$(BIN)/python -m pytest -v -n 2 tests/test_real_agents.py

fuzz: $(STAMP)
	$(BIN)/python -m pytest -q -n $(JOBS) --hypothesis-profile=long tests/test_fuzz.py tests/test_fuzz_cli.py tests/test_fuzz_hooks.py tests/test_fuzz_records.py tests/test_fuzz_trust.py

check: $(STAMP)
	$(BIN)/ruff check gitlease testing tests bench soak
	$(BIN)/ruff format --check gitlease testing tests bench soak
	$(BIN)/python -m pytest -q tests/test_layers.py
	$(BIN)/mypy gitlease  # the whole package (pyproject: strict on core/ and identity/); incremental: .mypy_cache

bench: $(STAMP)
	$(BIN)/python bench/run.py --write docs/performance.md
	$(BIN)/python bench/hooks.py --write docs/performance.md
	$(BIN)/python bench/guard.py --write docs/performance.md
	$(BIN)/python bench/plan.py --write docs/performance.md
	$(BIN)/python bench/fleet.py --write docs/performance.md
	$(BIN)/python bench/scale.py --write docs/performance.md
	$(BIN)/python bench/work.py --write docs/performance.md
	$(BIN)/python bench/train.py --write docs/performance.md

soak: $(STAMP)
	$(BIN)/python -m soak.run --duration $(DURATION) --workers $(WORKERS) --write docs/reliability.md

FLEET_TASKS ?= 40
fleet-soak: $(STAMP)
	$(BIN)/python -m soak.fleet --tasks $(FLEET_TASKS) --workers 3 --ttl 12 --stop --transport file,daemon,http --write docs/reliability.md

# the suite ROUNDS times under HOGS busy-looping processes; each failure by name (testing/stress.py)
ROUNDS ?= 10
HOGS   ?= 8
test-stress: $(STAMP)
	$(BIN)/python testing/stress.py --rounds $(ROUNDS) --hogs $(HOGS) --jobs $(JOBS)

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache

# Everyday entry points. The virtualenv and the broker's jars are set up on first use and reused.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: venv deps test demo bench lint broker-start broker-stop broker-status

venv: $(STAMP)

# Reinstall only when pyproject.toml changes (pip's cache serves torch and friends).
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q -e '.[test]'
	touch $@

# Machine-level tools: bubblewrap (sandboxes without Docker), the Kafka broker's jars (Maven), and
# a Docker engine with the local base image for Docker sandboxes (scripts/docker-engine.sh).
deps: venv
	@if ! command -v bwrap >/dev/null 2>&1; then \
		if [ "$$(id -u)" = 0 ]; then \
			apt-get update -qq && apt-get install -y -qq bubblewrap \
				|| echo "warning: could not install bubblewrap; sandboxed tools need it"; \
		else \
			echo "note: bubblewrap (bwrap) is missing; install it as root for sandboxed tools"; \
		fi; \
	fi
	$(BIN)/rollstream broker fetch
	./scripts/docker-engine.sh

test: venv deps
	$(BIN)/python -m pytest -q

demo: venv deps
	$(BIN)/rollstream demo

bench: venv deps
	$(BIN)/python -m benchmarks

lint: venv
	$(BIN)/ruff check .

broker-start: venv deps
	$(BIN)/rollstream broker start

broker-stop: venv
	$(BIN)/rollstream broker stop

broker-status: venv
	$(BIN)/rollstream broker status

# Everyday entry points. The virtualenv and the broker's jars are set up on first use and reused.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: venv deps harness-deps swebench-deps helm-deps slurm-deps test demo bench lint broker-start broker-stop broker-status images

venv: $(STAMP)

# Reinstall only when pyproject.toml changes (pip's cache serves torch and friends).
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q -e '.[test]'
	touch $@

# $(call apt_tool,COMMAND,PACKAGE,WHY): install Debian's PACKAGE when COMMAND is missing (as root;
# as another user, say so), never failing the build over it.
define apt_tool
if ! command -v $(1) >/dev/null 2>&1; then \
	if [ "$$(id -u)" = 0 ]; then \
		apt-get update -qq && apt-get install -y -qq $(2) \
			|| echo "warning: could not install $(2); $(3)"; \
	else \
		echo "note: $(1) is missing; install $(2) as root ($(3))"; \
	fi; \
fi
endef

# Machine-level tools: bubblewrap (sandboxes without Docker), the Kafka broker's jars (Maven), and
# a Docker engine with the local base image for Docker sandboxes (scripts/docker-engine.sh).
deps: venv
	@$(call apt_tool,bwrap,bubblewrap,sandboxed tools need it)
	$(BIN)/rollstream broker fetch
	@$(call apt_tool,prometheus,prometheus,the real-Prometheus test skips)
	./scripts/docker-engine.sh
	@$(call apt_tool,docker-compose,docker-compose,the compose test skips)
	$(MAKE) harness-deps swebench-deps helm-deps slurm-deps

# mini-swe-agent, the harness the gateway is proven with, in a virtualenv of its own: a harness
# is a separate program with its own dependencies. Versions pinned, litellm included.
HARNESS_VENV ?= .rollstream/harness-venv
HARNESS_STAMP := $(HARNESS_VENV)/.installed
harness-deps: $(HARNESS_STAMP)
$(HARNESS_STAMP):
	test -x $(HARNESS_VENV)/bin/python || $(PYTHON) -m venv $(HARNESS_VENV)
	$(HARNESS_VENV)/bin/pip install -q mini-swe-agent==2.4.6 litellm==1.110.2
	touch $@

# The official SWE-bench package without its dependencies (datasets, modal and more), plus the
# one its log parsers import: only for the test that checks our parsing and grading against
# its own (tests/test_swebench_contract.py). Pinned.
SWEBENCH_DIR ?= .rollstream/swebench
SWEBENCH_STAMP := $(SWEBENCH_DIR)/.installed
swebench-deps: $(SWEBENCH_STAMP)
$(SWEBENCH_STAMP): $(STAMP)
	$(BIN)/pip install -q --no-deps --target $(SWEBENCH_DIR) swebench==5.0.2 unidiff==0.7.5
	touch $@

# Helm, the manifest validator (deploy/helm/validate), the CRDs it checks the chart's custom
# resources against (KEDA, Strimzi, Prometheus Operator) and Kafka's consumer-group tool, pinned
# in scripts/helm-deps.sh: for tests/test_helm_chart.py and tests/test_keda_lag.py. Rebuilt when
# the script or the validator changes.
HELM_DIR ?= .rollstream/helm
HELM_STAMP := $(HELM_DIR)/.installed
helm-deps: $(HELM_STAMP)
$(HELM_STAMP): $(STAMP) scripts/helm-deps.sh deploy/helm/validate/main.go \
		deploy/helm/validate/go.mod deploy/helm/validate/go.sum
	PYTHON=$(BIN)/python ./scripts/helm-deps.sh $(HELM_DIR)
	touch $@

# Slurm's controller and compute daemons and munge, from Debian, for the Slurm recipe's test
# (tests/test_slurm.py starts them on this host with a configuration of its own).
slurm-deps:
	@$(call apt_tool,slurmctld,slurm-wlm munge,the Slurm test needs it)

# Local images for docker-compose.local.yml (scripts/local-images.sh), built with no registry or
# package index reachable from the builds: Kafka from the bundled broker's jars, Prometheus from
# Debian's package, Rollstream as Debian's Python running this checkout with .venv's packages.
# Docker's cache makes a rebuild take seconds; without an engine it says so and goes on.
images: deps
	./scripts/local-images.sh

# Two workers share one broker (tests/conftest.py); most tests wait on processes and the broker,
# so two of them overlap well on two cores. TEST_WORKERS=0 runs the suite in one process.
TEST_WORKERS ?= 2

test: venv deps images
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile

demo: venv deps
	$(BIN)/rollstream demo

bench: venv deps
	$(BIN)/python -m benchmarks

lint: venv
	$(BIN)/ruff check .
	$(BIN)/lint-imports --no-logo
	$(BIN)/rollstream schemas check

broker-start: venv deps
	$(BIN)/rollstream broker start

broker-stop: venv
	$(BIN)/rollstream broker stop

broker-status: venv
	$(BIN)/rollstream broker status

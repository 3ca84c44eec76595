# The two commands of the README: `make run` and `make test`. Both set themselves up.
# Everything builds once, in the release profile, and the tests reuse those artifacts.

CARGO        ?= cargo
WASM_DIR     := target/wasm-policies
WASM_OUT     := $(WASM_DIR)/wasm32-wasip2/release
ALLOTCTL     := target/release/allotctl
POLICY_0_1_0 := tests/fixtures/default-policy-0.1.0/default_policy.wasm
SCENARIOS_SINCE_0_1_0 := examples/scenarios/sort examples/scenarios/dual-stack \
	examples/scenarios/malformed examples/scenarios/wildcards

.PHONY: run test setup build policies lint scenarios schemas chart unit bench fuzz image \
	cluster cluster-test robustness robustness-sim

# The main job: the node agent in standalone mode on examples/standalone/ with the embedded
# default policy, listening on /run/allot/agent.sock (see the README for a pod's-eye view).
run: build
	exec target/release/allot-agent --standalone examples/standalone

# The whole test suite, as CI runs it (.ci/run).
test: lint build policies scenarios schemas chart unit cluster-test

setup:
	@scripts/setup.sh

build: setup
	$(CARGO) build --release --locked

# Policies the tests load: the hostile fixture and the zone-aware example. (The default policy
# is built and embedded by host/policy's build script.)
policies: setup
	$(CARGO) build --release --locked --target wasm32-wasip2 --target-dir $(WASM_DIR) \
		-p hostile-policy -p zone-aware

lint: setup
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --release --locked --workspace --all-targets -- -D warnings

scenarios: build policies
	$(ALLOTCTL) policy test examples/scenarios
	$(ALLOTCTL) policy test --policy $(WASM_OUT)/zone_aware.wasm examples/policies/zone-aware/scenarios
	# A component built against allot:policy@0.1.0 still decides as it did: the scenarios whose
	# behaviour 0.2.0's default did not change (the others are in host/policy/tests).
	$(ALLOTCTL) policy test --policy $(POLICY_0_1_0) $(SCENARIOS_SINCE_0_1_0)

# crds/ is current (a unit test of host/k8s) and valid, and the samples of examples/kubernetes
# pass their CRDs' schemas: offline, since no API server can run here.
schemas: build
	python3 scripts/check-k8s-schemas.py

# The Helm chart (charts/allot), offline: helm lint and template with real helm 4, Kubernetes'
# schemas, RBAC, every value applied, CRDs equal to crds/, the dashboard's metrics, and the
# rendered commands run against the in-memory API server (scripts/check-chart.py).
chart: build
	python3 scripts/check-chart.py

# The image of every component (Dockerfile), where a container builder exists:
# make image [IMAGE=registry.example.com/allot/allot:TAG]. CI cannot build images; the chart's
# image values are tested by rendering (make chart).
IMAGE ?= allot:$(shell sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
image:
	@builder=; found=; \
	for b in docker podman buildah; do \
		command -v $$b >/dev/null 2>&1 || continue; found="$$found $$b"; \
		if [ $$b = docker ] && ! docker info >/dev/null 2>&1; then continue; fi; \
		builder=$$b; break; \
	done; \
	if [ -z "$$builder" ]; then \
		if [ -z "$$found" ]; then echo "make image: no container builder here (docker, podman or buildah)"; \
		else echo "make image: found$$found, but docker's engine does not answer (docker info) and no podman or buildah: start an engine or install one"; fi; \
		exit 1; \
	fi; \
	set -x; if [ $$builder = buildah ]; then buildah bud -t $(IMAGE) .; else $$builder build -t $(IMAGE) .; fi

# Everything but the real-cluster suite (cluster-test runs it on labs of its own).
unit: policies
	$(CARGO) nextest run --release --locked --workspace -E 'not package(allot-cluster-tests)'

# A local Kubernetes cluster (tests/lab: upstream etcd and Kubernetes 1.37, three real nodes,
# each a network namespace with its own containerd, runc and kubelet) until Ctrl-C; prints
# KUBECONFIG=PATH once ready, then the commands that install allot's chart and Multus on it.
# The README's "Try it on a local control plane".
cluster: build policies
	exec target/release/allot-lab-cluster up

# The real-cluster suite on that control plane: allot installed with real helm, and what users
# do with it (scripts/cluster-test.sh).
cluster-test: build policies
	scripts/cluster-test.sh

bench: build policies
	$(CARGO) bench --locked -p allot-policy --bench decision
	$(ALLOTCTL) policy bench --pools 1000 --iterations 20000
	$(CARGO) bench --locked -p allot-engine --bench address_choice
	$(CARGO) bench --locked -p allot-core --bench autopool
	$(CARGO) bench --locked -p allot-store --bench node_scale
	$(CARGO) bench --locked -p allot-e2e --bench cni_cycle
	$(CARGO) bench --locked -p allot-e2e --bench etcd_fleet
	$(CARGO) bench --locked -p allot-e2e --bench probe_latency
	$(CARGO) bench --locked -p allot-e2e --bench store_rates
	$(CARGO) bench --locked -p allot-e2e --bench store_fanout
	$(CARGO) bench --locked -p allot-controller --bench gc_scan
	$(CARGO) bench --locked -p allot-controller --bench admission
	$(CARGO) bench --locked -p allot-controller --bench fleet_pass

# The robustness simulation (tests/robustness, docs/robustness.md): SEEDS seeds of each
# scenario, or of SCENARIO (sqlite-node, sqlite-shared, kube-shared), on JOBS threads; SEED=N
# runs one seed and writes its history to robustness-seed-N.jsonl. Not part of `make test`
# (`make unit` runs a thousand seeds of each scenario). A failure prints the seed and the
# operations that show each violation, writes robustness-failure.jsonl and exits non-zero.
SEEDS    ?= 100000
JOBS     ?= 2
SCENARIO ?= all
robustness-sim: setup
	$(CARGO) build --release --locked -p allot-robustness
	@if [ -n "$(SEED)" ]; then \
		target/release/allot-robustness-sim --scenario $(SCENARIO) --seed $(SEED) --history robustness-seed-$(SEED).jsonl; \
	else \
		target/release/allot-robustness-sim --scenario $(SCENARIO) --seeds $(SEEDS) --jobs $(JOBS) --history robustness-failure.jsonl; \
	fi

# The fault campaign on the real cluster (docs/robustness.md): SEEDS seeds from SEED, each
# DURATION seconds of a random workload and random faults on a lab of its own, judged by the
# history checker; each seed's history in target/robustness/campaign-seed-N.jsonl. `make test`
# runs two seeds of 60 s in its shared phase. Runs as root (the lab's namespaces and mounts).
robustness: build policies
	ALLOT_ROBUSTNESS_SEED=$(or $(SEED),1) \
	ALLOT_ROBUSTNESS_SEEDS=$(if $(filter command line,$(origin SEEDS)),$(SEEDS),1) \
	ALLOT_ROBUSTNESS_DURATION=$(or $(DURATION),180) \
	$(CARGO) nextest run --release --locked --workspace --no-capture \
		-E 'package(allot-cluster-tests) & test(=robustness::a_seeded_fault_campaign_keeps_every_promise)'

# One fuzzing campaign (AFL++ through cargo-afl, installed on first use; never part of `make
# test`, which replays the committed corpora). Stops after EXECS executions or TIME seconds,
# whichever comes first: make fuzz TARGET=pools [EXECS=10000000] [TIME=3600]. fuzz/README.md.
fuzz:
	scripts/fuzz.sh run $(TARGET) $(EXECS) $(TIME)

# Local Kubernetes control plane for integration tests (see tests/cluster/README.md).
# `make -s cluster-up` prints only the kubeconfig path on stdout:
#   export KUBECONFIG=$(make -s cluster-up)

.PHONY: cluster-build cluster-up cluster-down node-up node-down

cluster-build: ## build etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kubectl, kwok
	@bash tests/cluster/build.sh

cluster-up: ## start (or reuse) the control plane; last stdout line is the kubeconfig path
	@bash tests/cluster/up.sh

cluster-down: ## stop it (and the real node) and remove .cluster/ (and a second cluster a test left, .cluster-*/)
	@bash tests/cluster/down.sh
	@for dir in .cluster-*/; do [ -d "$$dir" ] && CLUSTER_DIR=$(CURDIR)/$${dir%/} bash tests/cluster/down.sh; done; true

node-up: ## add the real node (kubelet, containerd, kube-proxy, CoreDNS) to the running control plane; needs root
	@bash tests/cluster/node-up.sh

node-down: ## stop the real node and undo what it did to the machine (mounts, cgroups, iptables)
	@bash tests/cluster/node-down.sh

# ---- the two commands of the README -------------------------------------------------------------

.PHONY: demo install-check test fmt-check clippy deny doc docs docs-gen unit integration chaos tenant-chaos bench bench-map bench-fair bench-requests bench-hooks crds hook-libs hook-types hook-wire-types image chart-readme failover shards switch-from-metacontroller metacontroller-examples

demo: ## the hello-world controller end to end on the local control plane
	@bash examples-python/hello-world/demo.sh

install-check: ## `cargo install --path . --locked` (dev profile) gives a metahook that runs render and rbac away from the repository
	@bash tests/install.sh

test: fmt-check clippy deny doc docs unit hook-types hook-libs integration demo install-check ## everything CI runs

fmt-check:
	cargo fmt --check

clippy:
	cargo clippy --all-targets --locked -- -D warnings

doc: ## the crate's documentation, refusing broken links and other rustdoc warnings
	RUSTDOCFLAGS="-D warnings" cargo doc --no-deps --locked

unit: ## Rust unit tests, the house rules of tests/house.rs and the book's links and samples (tests/docs.rs); no cluster
	cargo test --locked --lib --bins --test house --test docs

# mdbook is a tool, not a dependency of the crate: installed once into target/tools (from crates.io).
MDBOOK_VERSION := 0.4.52
MDBOOK := target/tools/bin/mdbook

docs: ## the book (docs/) into target/book, offline; installs the pinned mdbook into target/tools when missing
	@if [ "$$($(MDBOOK) --version 2>/dev/null)" != "mdbook v$(MDBOOK_VERSION)" ]; then \
	  cargo install mdbook --locked --version $(MDBOOK_VERSION) --no-default-features --features search --root target/tools; fi
	$(MDBOOK) build docs -d ../target/book
	@! grep -rlE '<(script|link)[^>]*(src|href)="(https?:)?//' target/book --include='*.html' \
	  || { echo "the pages above load scripts or styles from the network; the book must work offline" >&2; exit 1; }

# cargo-deny, the dependency policy's checker (deny.toml): a pinned tool like mdbook, but kept outside
# the clone, per version, because it takes 10-30 minutes to build on 2 cores (CI's fresh clones reuse it).
CARGO_DENY_VERSION := 0.20.2
TOOLS_CACHE ?= $(HOME)/.cache/metahook/tools
CARGO_DENY := $(TOOLS_CACHE)/cargo-deny-$(CARGO_DENY_VERSION)/bin/cargo-deny

deny: ## the dependency policy (deny.toml): licenses, banned and duplicate crates, sources; offline (advisories: SECURITY.md)
	@if [ "$$($(CARGO_DENY) --version 2>/dev/null)" != "cargo-deny $(CARGO_DENY_VERSION)" ]; then \
	  echo "building cargo-deny $(CARGO_DENY_VERSION) into $(TOOLS_CACHE) (once per machine: 10-30 min on 2 cores)"; \
	  cargo install cargo-deny --locked --version $(CARGO_DENY_VERSION) --root $(TOOLS_CACHE)/cargo-deny-$(CARGO_DENY_VERSION); fi
	@# Every platform's crates are in Cargo.lock; cargo-deny reads them offline once they are downloaded.
	cargo fetch --locked --quiet
	$(CARGO_DENY) --offline check licenses bans sources

HOOK_TOOLS ?= $(CURDIR)/target/hook-tools

hook-libs: hook-types ## tests of the Python and Node hook helper libraries, installing them as packages too
	@if [ -d examples-python/metahook-hooks/tests ]; then python3 -m pytest -q examples-python/metahook-hooks; fi
	@if [ -d examples-js/metahook-hooks/test ]; then \
	  TSC=$(HOOK_TOOLS)/node/node_modules/.bin/tsc TYPE_ROOTS=$(HOOK_TOOLS)/node/node_modules/@types \
	  node --test examples-js/metahook-hooks/test/; fi

hook-wire-types: ## regenerate the hook libraries' wire types (wire_gen.py, wire.d.ts) from the Rust types in src/hooks/wire.rs
	METAHOOK_UPDATE_WIRE_TYPES=1 cargo test --locked --lib tools::wiretypes::tests::checked_in_wire_types_match_the_rust_types

hook-types: ## mypy --strict and tsc --strict over the hook libraries and every example (pinned tools, target/hook-tools)
	@HOOK_TOOLS=$(HOOK_TOOLS) bash tests/hook-types/check.sh

integration: cluster-up ## integration and end-to-end tests against the real control plane
	@rm -rf target/faults
	@cargo test --locked --no-fail-fast --test '*' -- --test-threads=4; status=$$?; \
	  echo "---- fault suite figures (tests/faults.rs) ----"; cat target/faults/*.txt 2>/dev/null; exit $$status

chaos: cluster-up ## the fault suite, long (20 hub kills during a 200-parent rollout, every other scenario), then the seeded tenant run (SEED=, STEPS=; default 61 and 300)
	@rm -rf target/faults
	@FAULT_KILLS=20 FAULT_PARENTS=200 cargo test --locked --test faults -- --test-threads=4; status=$$?; \
	  echo "---- fault suite figures ----"; cat target/faults/*.txt 2>/dev/null; exit $$status
	TENANT_SEED=$${SEED:-61} TENANT_STEPS=$${STEPS:-300} cargo test --locked --test tenant_chaos -- --nocapture

tenant-chaos: cluster-up ## only the seeded tenant and fault run (SEED=, STEPS=): tenants, hub kills, controllers deleted, invariants after each step
	TENANT_SEED=$${SEED:-61} TENANT_STEPS=$${STEPS:-300} cargo test --locked --test tenant_chaos -- --nocapture

# MC_SRC=<a clone of github.com/metacontroller/metacontroller> builds Metacontroller once into target/bench/ (go build;
# again only when the clone's HEAD is newer) and runs it, tuned, with its own CRDs; MC_BIN=<its binary> runs that one.
# Every system gets a control plane started anew (down.sh + up.sh); FRESH=0 keeps one for all of them.
bench: cluster-up ## fanout benchmark vs raw clients, the Metacontroller mix and Metacontroller (MC_SRC= or MC_BIN=), goals table, then hook call overhead (release; N=, RUNS=, FRESH=0, MEM=1 [SHARDS=1,2,3], IDLE=, LATENCY=, RESTARTS=, RESYNC=, HUB_BIN=, BASELINE_BIN=, SYSTEMS=, HUB_CONFIG=)
	cargo test --release --locked --test bench -- --full
	@if [ "$${MEM:-0}" != 1 ]; then cargo bench --locked --bench hooks; fi

bench-map: cluster-up ## a MapController vs the same controller as a CompositeController+customize: one parent, N=1000 inputs, hook calls, bytes and writes per one-input change (CHANGES=, FRESH=0)
	cargo test --release --locked --test bench-map -- --full

bench-fair: cluster-up ## one tenant's flood (N=10000), a restart's relist and a 5 s hook against 20 other tenants' changes: latency p50/p99/max, flood convergence (BASELINE_BIN=, MC_SRC= or MC_BIN=, SYSTEMS=, FRESH=0)
	cargo test --release --locked --test bench-fair -- --full

bench-requests: cluster-up ## what one request of each kind the fanout systems make costs the API server and etcd (CPU ms; N=)
	python3 tests/bench/request_costs.py

bench-hooks: ## hook client per-call overhead, with and without keep-alive, against a Python hook (prints figures)
	cargo bench --locked --bench hooks

docs-gen: ## regenerate the book's reference pages (docs/src/reference/: configuration, CRDs, metrics, command line)
	METAHOOK_UPDATE_DOCS=1 cargo test --locked --lib tools::reference::tests::checked_in_reference_pages_match_what_the_code_generates

crds: ## regenerate crds/ from src/api/, and deploy/'s copies of them
	METAHOOK_UPDATE_CRDS=1 cargo test --lib tools::crds::tests::checked_in_crds_match_the_rust_types
	bash deploy/sync.sh

image: ## OCI image archive dist/metahook-image.tar (+ its SPDX SBOM) from the release binary and Debian packages (deploy/image/build.sh)
	cargo build --release --locked
	bash deploy/image/build.sh target/release/metahook dist/metahook-image.tar

chart-readme: ## regenerate the value table of deploy/helm/metahook/README.md from values.yaml's comments
	METAHOOK_UPDATE_CHART_README=1 cargo test --locked --test deploy chart_readme_lists_every_value_as_values_yaml_says

failover: cluster-up ## two-replica fail-over, FAILOVER_ROUNDS (default 5) kill -9 rounds; prints take-over times
	cargo test --locked --test leader -- --ignored --nocapture --test-threads=1

metacontroller-examples: cluster-up ## Metacontroller's own examples, each by its unchanged test.sh, against the hub installed by its chart on the real node (MC_SRC=<clone>, root; EXAMPLES= to pick): PASSED/FAILED, teardown times, leftovers
	bash tests/metacontroller-examples.sh $(EXAMPLES)

switch-from-metacontroller: cluster-up ## switch from the real Metacontroller (MC_SRC= or MC_BIN=, as for bench): writes per child through the switch and two restarts
	cargo test --locked --test migrate -- --ignored --nocapture a_switch_from_the_real_metacontroller

shards: cluster-up ## sharding at full size (release build): 3 replicas x 3,000 parents, a kill -9, a 4th replica; prints converge times and moves
	cargo test --release --locked --test sharding -- --ignored --nocapture --test-threads=1

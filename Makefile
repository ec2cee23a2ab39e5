# hostcycle — the two commands a fresh machine needs:
#   make lab   installs what is missing, then runs a local lab until Ctrl-C
#   make test  installs what is missing, then runs fmt, clippy and every test
SHELL := /bin/bash
CARGO ?= cargo
# CI builds from a clean clone: incremental compilation's bookkeeping only costs time there.
ifeq ($(CI),true)
export CARGO_INCREMENTAL ?= 0
endif
# The lab and the node simulator (`hostcycle lab`, `hostcycle sim`) and the test rig they
# link are a cargo feature: on for the lab and the tests, off in the production binary.
LAB := --features hostcycle/lab

.PHONY: lab test prereqs build check-format lint unit-and-e2e bench deploy-manifests

prereqs:
	bash scripts/install-prereqs.sh

build: prereqs
	$(CARGO) build -p hostcycle $(LAB)

lab: build
	$(CARGO) run -q -p hostcycle $(LAB) -- lab

test: prereqs check-format lint unit-and-e2e

# Regenerate deploy/ from the Rust types (a test fails when the checked-in files are stale):
# crds.yaml and operator.yaml, and the copies the kustomize base and the Helm chart carry
# (neither tool reads files outside its own directory).
# (With the tests' features: the manifests are the same, and the binary is not rebuilt.)
deploy-manifests:
	$(CARGO) run -q -p hostcycle $(LAB) -- manifests --deploy --output-dir deploy
	cp deploy/crds.yaml deploy/operator.yaml deploy/kustomize/
	cp deploy/crds.yaml deploy/helm/hostcycle/crds/crds.yaml
	cp deploy/monitoring/prometheus-rule.yaml deploy/monitoring/grafana-dashboard.json \
	  deploy/helm/hostcycle/files/

check-format:
	$(CARGO) fmt --all --check

# Both builds: the production binary (no lab) and the one the tests and the lab use.
lint:
	$(CARGO) clippy --workspace --all-targets --locked -- -D warnings
	$(CARGO) clippy -p hostcycle --all-targets --locked $(LAB) -- -D warnings

unit-and-e2e:
	@if $(CARGO) nextest --version >/dev/null 2>&1; then \
	  $(CARGO) nextest run --workspace --locked --profile ci $(LAB); \
	else \
	  $(CARGO) test --workspace --locked $(LAB); \
	fi

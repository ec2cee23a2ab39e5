# hostcycle — the two commands a fresh machine needs:
#   make lab   installs what is missing, then runs a local lab until Ctrl-C
#   make test  installs what is missing, then runs fmt, clippy and every test
SHELL := /bin/bash
CARGO ?= cargo

.PHONY: lab test prereqs build check-format lint unit-and-e2e bench deploy-manifests

prereqs:
	bash scripts/install-prereqs.sh

build: prereqs
	$(CARGO) build -p hostcycle

lab: build
	$(CARGO) run -q -p hostcycle -- lab

test: prereqs check-format lint unit-and-e2e

# Regenerate deploy/ from the Rust types (a test fails when the checked-in files are stale).
deploy-manifests:
	$(CARGO) run -q -p hostcycle -- manifests --deploy --output-dir deploy

check-format:
	$(CARGO) fmt --all --check

lint:
	$(CARGO) clippy --workspace --all-targets --locked -- -D warnings

unit-and-e2e:
	@if $(CARGO) nextest --version >/dev/null 2>&1; then \
	  $(CARGO) nextest run --workspace --locked --profile ci; \
	else \
	  $(CARGO) test --workspace --locked; \
	fi

# hostcycle — the two commands a fresh machine needs:
#   make lab   installs what is missing, then runs a local lab until Ctrl-C
#   make test  installs what is missing, then runs fmt, clippy and every test
SHELL := /bin/bash
CARGO ?= cargo

.PHONY: lab test prereqs build check-format lint unit-and-e2e bench

prereqs:
	bash scripts/install-prereqs.sh

build: prereqs
	$(CARGO) build -p hostcycle

lab: build
	$(CARGO) run -q -p hostcycle -- lab

test: prereqs check-format lint unit-and-e2e

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

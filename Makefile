# FluxVM. `make run` and `make test` are the two commands a newcomer needs (see README.md).
SHELL := /bin/bash
.DEFAULT_GOAL := build
STATE_DIR ?= ./.fluxvm
LISTEN ?= 127.0.0.1:7788
PREFIX ?= /usr/local

.PHONY: setup native sdk addon js build install uninstall run test vm-images generate verify lint format format-check deps bench clean asan deploy-render

setup:
	./hack/setup.sh

# Native parts: the procbox helper, the VM guest agent and tap helper, the egress splice helper (C, built with the host gcc).
native: setup
	@for d in native/procbox native/vm native/egress; do if [ -f $$d/Makefile ]; then $(MAKE) -C $$d || exit 1; fi; done

# @fluxvm/sdk (sdk/README.md), a package of its own: sdk/dist (ESM + .d.ts) from sdk/src, rebuilt only when
# a source changed; built beside and swapped in whole, so nothing of a removed source stays.
SDK_SRC := $(shell find sdk/src -name '*.ts' 2>/dev/null)
sdk: sdk/dist/index.js
sdk/dist/index.js: $(SDK_SRC) sdk/tsconfig.json sdk/package.json | setup # order-only: node_modules first, even under make -j
	@tmp=sdk/dist.tmp.$$$$; rm -rf $$tmp; echo "npx tsc -p sdk/tsconfig.json (into sdk/dist)"; \
	npx tsc -p sdk/tsconfig.json --outDir $$tmp || { rm -rf $$tmp; exit 1; }; rm -rf sdk/dist; mv $$tmp sdk/dist

build: native sdk addon js

js: setup native sdk
	npx tsc -p tsconfig.json
	node hack/bundle-client-node.mjs # fluxctl's start-up: the part of client-node it uses, in one file
	node hack/bundle-fluxctl.mjs # dist/fluxctl/main.js: fluxctl and its packages in one bundle (split per verb)
	node console/build.mjs --check # the review console (console/README.md) into dist/console

# better-sqlite3's native addon, which hack/setup.sh's `npm ci --ignore-scripts` leaves out: its
# install script (a prebuilt binary from GitHub, else SQLite compiled here, about 70 s of one core)
# run only when the addon is missing, so that under `make -j` it runs beside tsc and the linters.
SQLITE_ADDON := node_modules/better-sqlite3/build/Release/better_sqlite3.node
addon: setup
	@if [ ! -f $(SQLITE_ADDON) ]; then echo "npm rebuild better-sqlite3 (its SQLite addon)"; \
	npm rebuild --no-audit --no-fund better-sqlite3 >node_modules/.addon.log 2>&1 || { cat node_modules/.addon.log; exit 1; }; fi

# fluxctl on PATH: a two-line wrapper that runs this checkout's dist/ with this node (never
# `npx fluxctl`, which would ask the npm registry for a package of that name), and bash
# completion where bash-completion looks for it.
install: build
	@mkdir -p $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/share/bash-completion/completions
	@printf '#!/bin/sh\nexec "%s" "%s/dist/fluxctl/main.js" "$$@"\n' "$$(command -v node)" "$(CURDIR)" > $(DESTDIR)$(PREFIX)/bin/fluxctl
	@chmod 0755 $(DESTDIR)$(PREFIX)/bin/fluxctl
	@ln -sf fluxctl $(DESTDIR)$(PREFIX)/bin/kubectl-fluxvm # the kubectl plugin: kubectl fluxvm exec -it NAME -- sh
	@$(DESTDIR)$(PREFIX)/bin/fluxctl completion bash > $(DESTDIR)$(PREFIX)/share/bash-completion/completions/fluxctl
	@echo "installed $(DESTDIR)$(PREFIX)/bin/fluxctl and the kubectl plugin kubectl-fluxvm (bash completion: $(DESTDIR)$(PREFIX)/share/bash-completion/completions/fluxctl)"

uninstall:
	rm -f $(DESTDIR)$(PREFIX)/bin/fluxctl $(DESTDIR)$(PREFIX)/bin/kubectl-fluxvm $(DESTDIR)$(PREFIX)/share/bash-completion/completions/fluxctl

run: build
	node dist/fluxctl/main.js serve --state-dir $(STATE_DIR) --listen $(LISTEN)

generate: setup
	npx tsx hack/generate.ts

# The cluster install (deploy/README.md), both overlays rendered by kubectl's kustomize into deploy/out/.
deploy-render:
	@mkdir -p deploy/out && for o in crd aggregated; do kubectl kustomize deploy/overlays/$$o > deploy/out/$$o.yaml || exit 1; echo "deploy/out/$$o.yaml"; done

# The gates CI runs (through `make test`): generated files fresh, eslint (typescript-eslint, type-aware;
# eslint.config.js), prettier's format (.prettierrc.json), and the layers' one-way arrows with no import
# cycle (dependency-cruiser; .dependency-cruiser.cjs). test/hack/gates.test.ts checks each gate fails
# on a planted violation. The three run side by side (each is one process; eslint, the longest, is ~1 min
# of CPU); --output-sync keeps each one's report in one piece.
verify: setup
	npx tsx hack/generate.ts --verify
	$(MAKE) --no-print-directory -j3 --output-sync=target lint format-check deps

lint:
	npx eslint --max-warnings 0 .

# Rewrites the TypeScript/JavaScript files in prettier's format; format-check only reports.
FORMAT_FILES := '**/*.{ts,js,cjs,mjs}'
format:
	npx prettier --write --log-level warn $(FORMAT_FILES)

format-check:
	npx prettier --check --log-level warn $(FORMAT_FILES)

deps:
	npx depcruise --config .dependency-cruiser.cjs apis runtime controllers native cmd

# The VM guest images (kernel + initramfs, and the Debian userland with python3 and git) are
# built from Debian packages once and cached; without QEMU the VM tests skip with a reason.
vm-images: native
	@if command -v qemu-system-x86_64 >/dev/null; then $(MAKE) -C native/vm image image-rootfs; \
	else echo "vm-images: qemu-system-x86_64 missing, VM tests will be skipped"; fi

# hack/leakcheck.sh fails the run when the suite left mounts, loop devices, cgroups, processes
# or links of FluxVM on the host (LEAKCHECK=0: off). Test files run in TEST_JOBS mocha workers
# (default 3 on the 2-core CI host: with 2 the suite's processes used about 75% of the two cores,
# the rest spent waiting on timers, fsyncs and guests; each file owns its state directory, ports
# and links); TEST_JOBS=1 runs them one after another.
# The build, the gates and the VM images are independent and mostly one process each, so they
# run side by side first (--output-sync: each one's output in one piece when it ends). SQLite's
# addon compiles beside them: on a fresh 2-core clone this step took 226 s with the compile inside
# npm ci and 175-191 s with it beside the rest.
# The files go to the workers longest first (test/support/order.mjs, from the per-file times of a
# full run in test/support/file-times.json), so the run does not end on one worker's long file.
TEST_JOBS ?= 3
test:
	$(MAKE) --no-print-directory -j3 --output-sync=target build verify vm-images
	./hack/leakcheck.sh npx mocha $(if $(filter-out 1,$(TEST_JOBS)),--parallel --jobs $(TEST_JOBS)) $$(node test/support/order.mjs)

# The C helpers' input parsers and path resolver under AddressSanitizer + UBSan, fuzzed for
# FUZZ_SECONDS (native/procbox and native/vm Makefiles; test/native/procbox/fuzz-asan.test.ts
# and test/native/vm/agent-asan.test.ts run them in `make test`).
asan:
	$(MAKE) -C native/procbox asan
	$(MAKE) -C native/vm asan

bench: build
	npx tsx bench/run.ts

clean:
	rm -rf dist native/procbox/build native/procbox/build-asan native/vm/build native/vm/build-asan native/egress/build

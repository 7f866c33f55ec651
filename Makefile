# FluxVM. `make run` and `make test` are the two commands a newcomer needs (see README.md).
SHELL := /bin/bash
.DEFAULT_GOAL := build
STATE_DIR ?= ./.fluxvm
LISTEN ?= 127.0.0.1:7788

.PHONY: setup native build run test test-unit test-e2e generate verify bench clean

setup:
	./hack/setup.sh

# Native parts: the procbox helper and the VM guest agent (C, built with the host gcc).
native: setup
	@for d in native/procbox native/vm; do if [ -f $$d/Makefile ]; then $(MAKE) -C $$d || exit 1; fi; done

build: setup native
	npx tsc -p tsconfig.json

run: build
	node dist/cmd/fluxctl/main.js serve --state-dir $(STATE_DIR) --listen $(LISTEN)

generate: setup
	npx tsx hack/generate.ts

verify: setup
	npx tsx hack/generate.ts --verify

test: build verify
	npx mocha 'test/**/*.test.ts'

bench: build
	npx tsx bench/run.ts

clean:
	rm -rf dist native/procbox/build native/vm/build

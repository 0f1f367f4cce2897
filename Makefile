# dflash-serve developer entry points. `make demo` and `make test` set up what they need.
SHELL := /bin/bash
.DEFAULT_GOAL := help

VENV      := .venv
VENV033   := .venv-vllm033
PY        := $(VENV)/bin/python
PY033     := $(VENV033)/bin/python
export PATH := $(CURDIR)/.cache/bin:$(PATH)

# Image names: `make images REGISTRY=... TAG=...`; the chart's defaults use the same names.
REGISTRY  ?= ghcr.io/dflash-serve
SIDECAR_EXTRAS ?=
TAG       ?= $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
VLLM_VERSION  := 0.33.0
ENGINE_IMAGE  := $(REGISTRY)/vllm-dflash:$(VLLM_VERSION)-dflash-$(TAG)
SIDECAR_IMAGE := $(REGISTRY)/sidecar:$(TAG)
CPU_IMAGE     := $(REGISTRY)/dflash-serve-cpu:$(TAG)
ROUTER_VERSION := $(shell sed -n 's/^ARG VLLM_ROUTER_VERSION=//p' docker/router.Dockerfile | head -n1)
ROUTER_IMAGE  := $(REGISTRY)/vllm-router:$(ROUTER_VERSION)
REVISION      ?= $(shell git rev-parse HEAD 2>/dev/null || echo unknown)
# `make release`: where the built images are (podman's store with images-local; the Docker
# engine's with `make images`, then LOCAL_PREFIX=$(REGISTRY)), which to publish, where to.
SOURCE        ?= containers-storage
LOCAL_PREFIX  ?= localhost/dflash-serve
IMAGES        ?= engine,sidecar,router,cpu
RELEASE_OUT   ?= release-out
SERIES_SHA256  = $(shell python3 -c 'import hashlib, json; m = json.load(open("patches/manifest.json")); print(hashlib.sha256("".join(p["sha256"] for p in m["patches"]).encode()).hexdigest())')

.PHONY: help setup lint typecheck test check phases-reset demo demo-down clean images images-local generate generate-check release

# Each phase of `make test` / `make check` appends "phase<TAB>seconds" here; run-tests.sh prints
# the table at the end, so a change sees what it added.
PHASES := .cache/test-logs/phases.tsv

help: ## list targets
	@grep -E '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-14s %s\n", $$1, $$2}'

setup: ## create .venv, .venv-vllm033 and fetch helm/kubectl/prometheus (idempotent, cached)
	@t=$$SECONDS; bash ops/setup/setup.sh all || exit 1; mkdir -p $(dir $(PHASES)); printf 'set-up\t%s\n' $$((SECONDS - t)) >> $(PHASES)

phases-reset:
	@mkdir -p $(dir $(PHASES)); : > $(PHASES)

lint: setup ## ruff
	@echo "==> ruff"
	@t=$$SECONDS; $(VENV)/bin/ruff check service ops patches tests && $(VENV)/bin/ruff format --check service ops patches tests || exit 1; echo "==> ruff took $$((SECONDS - t)) s"; printf 'lint\t%s\n' $$((SECONDS - t)) >> $(PHASES)

typecheck: setup ## mypy (strict) on service/ and ops/
	@echo "==> mypy"
	@t=$$SECONDS; $(VENV)/bin/mypy || exit 1; echo "==> mypy took $$((SECONDS - t)) s"; printf 'types\t%s\n' $$((SECONDS - t)) >> $(PHASES)

# Pass 1 of `make test` on TEST_WORKERS pytest-xdist workers (0: in one process).
TEST_WORKERS ?= 2

test: phases-reset lint typecheck images-local ## lint, type checks, images, then the whole test suite in both environments
	@PASS1_WORKERS=$(TEST_WORKERS) PASS2_NICE=10 bash ops/setup/run-tests.sh --engines-together $(PYTEST_ARGS)

# The quick loop: every test that starts no vLLM engine (e2e) and builds or runs no image
# (tests/docker); both environments, as `make test` runs them, pass 1 on two xdist workers.
check: phases-reset lint typecheck ## lint, types and every test without an engine or an image (the quick loop)
	@PASS1_WORKERS=2 bash ops/setup/run-tests.sh -q -m "not e2e and not heavy_images" --ignore=tests/docker --ignore=tests/e2e $(PYTEST_ARGS)

generate: setup ## regenerate every committed generated file (dashboards, chart tables, examples, schema limits, the plan quotes in docs/planning.md, patch manifest)
	@$(PY) -m dflash_ops.generate

generate-check: setup ## fail if a committed generated file is stale
	@$(PY) -m dflash_ops.generate --check

demo: ## the main job: the paying pair with and without speculation (vLLM CPU engines, sidecar, Prometheus), benchmarked side by side
	@bash ops/setup/setup.sh demo
	@bash ops/setup/demo.sh
	@echo "==> side by side: bench-out/compare.md; each run: bench-out/off/, bench-out/draft_model-k*/ (results.md, acceptance.png)"
	@echo "==> the speculative stack keeps running: sidecar http://127.0.0.1:9100/stats, Prometheus http://127.0.0.1:9090; stop it with: make demo-down"

demo-down: ## stop the local stack
	@$(VENV)/bin/dflash-serve local down

images: ## build the engine, sidecar, router and CPU images (needs a Docker engine; REGISTRY=, TAG=, SIDECAR_EXTRAS=)
	docker build -f docker/vllm.Dockerfile --build-arg REVISION=$(REVISION) --build-arg DFLASH_VERSION=$(TAG) --build-arg PATCH_SERIES_SHA256=$(SERIES_SHA256) -t $(ENGINE_IMAGE) .
	docker build -f docker/sidecar.Dockerfile --build-arg REVISION=$(REVISION) --build-arg DFLASH_VERSION=$(TAG) --build-arg EXTRAS=$(SIDECAR_EXTRAS) -t $(SIDECAR_IMAGE) .
	docker build -f docker/router.Dockerfile --build-arg REVISION=$(REVISION) -t $(ROUTER_IMAGE) .
	docker build -f docker/cpu.Dockerfile --build-arg REVISION=$(REVISION) --build-arg DFLASH_VERSION=$(TAG) -t $(CPU_IMAGE) .

release: ## publish the built images (signed, SBOMs) and the chart: REGISTRY= VERSION= SIGN_KEY= LOOKASIDE= [PLAIN_HTTP=1]
	@test -n "$(VERSION)" -a -n "$(SIGN_KEY)" -a -n "$(LOOKASIDE)" || { echo "make release needs REGISTRY=HOST[:PORT]/PATH VERSION=X SIGN_KEY=ID LOOKASIDE=URL (PLAIN_HTTP=1 for a registry without TLS)" >&2; exit 2; }
	@$(PY) -m dflash_ops.release --registry $(REGISTRY) --version $(VERSION) --sign-key $(SIGN_KEY) \
		--lookaside $(LOOKASIDE) $(if $(LOOKASIDE_STAGING),--lookaside-staging $(LOOKASIDE_STAGING)) \
		$(if $(PLAIN_HTTP),--plain-http) --images $(IMAGES) --source $(SOURCE) \
		--local-prefix $(LOCAL_PREFIX) --out $(RELEASE_OUT)

images-local: setup ## podman, no registry: stand-in bases (cached), then the sidecar, router and engine images
	@t=$$SECONDS; bash ops/setup/images-local.sh all || exit 1; echo "==> images took $$((SECONDS - t)) s"; printf 'images\t%s\n' $$((SECONDS - t)) >> $(PHASES)

clean: ## remove virtualenvs and caches
	rm -rf $(VENV) $(VENV033) .cache .pytest_cache .mypy_cache .ruff_cache

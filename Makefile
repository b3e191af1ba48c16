# FutureWorld: `make demo` runs the main job, `make test` runs the tests. Both set up
# everything themselves (venv, install, services).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
TORCH := torch==2.13.0
TEST_ARGS ?=

.PHONY: install constraints test demo lint services browser clean bench

install: $(STAMP)

# torch is installed first and pinned (a CPU wheel); the project's own `torch>=2.4` then
# installs nothing more. Every other package is installed at the version constraints.txt
# names. The stamp makes re-runs instant until pyproject.toml or constraints.txt changes.
$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet $(TORCH)
	$(PY) -m pip install --quiet -c constraints.txt -e ".[test]"
	touch $(STAMP)

# After a deliberate upgrade (pip install -U ... in the venv): write the venv's versions back.
constraints: install
	{ sed -n '/^#/p' constraints.txt; $(PY) -m pip freeze --exclude-editable | grep -v -i '^torch=='; } > constraints.new
	mv constraints.new constraints.txt

services:
	bash infra/postgres/ensure.sh

# Headless Chromium for the test that renders the Prefect UI's artifact pages (apt, as root
# or through sudo); a no-op once `chromium` is on PATH.
browser:
	bash infra/browser/ensure_chromium.sh

lint: install
	$(VENV)/bin/ruff check futureworld storage flows tests benchmarks
	$(VENV)/bin/lint-imports

test: install services browser
	$(VENV)/bin/ruff check futureworld storage flows tests benchmarks
	$(PY) -m pytest $(TEST_ARGS)

demo: install
	$(VENV)/bin/futureworld demo $(DEMO_ARGS)

bench: install services
	$(PY) benchmarks/storage_throughput.py
	$(PY) benchmarks/agent_loop.py
	$(PY) benchmarks/train_throughput.py
	$(PY) benchmarks/predict_throughput.py
	$(PY) benchmarks/predict_http.py
	$(PY) benchmarks/backfill_scale.py
	$(PY) benchmarks/search_latency.py

clean:
	rm -rf $(VENV) .futureworld .pytest_cache

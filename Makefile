# The two entry points of the README. Both set up .venv first (idempotent).
PY := .venv/bin/python

.PHONY: setup demo test test-fast
setup:
	@bash scripts/setup.sh

demo: setup
	$(PY) -m experiments.demo

test: setup
	$(PY) -m pytest -q -n 2 tests

test-fast: setup
	$(PY) -m pytest -q -x -m "not slow" tests

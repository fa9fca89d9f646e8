# The two entry points of the README. Both set up .venv first (idempotent).
PY := .venv/bin/python

.PHONY: setup demo test test-fast
setup:
	@bash scripts/setup.sh

demo: setup
	$(PY) -m experiments.demo

# --dist loadfile: a module's tests run on one worker, so tests of one run share its compiled steps.
test: setup
	$(PY) -m pytest -q -n 2 --dist loadfile tests

test-fast: setup
	$(PY) -m pytest -q -x -m "not slow" tests

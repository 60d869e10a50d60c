# Two entry points for a fresh machine with Python 3.11: `make demo` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
# the CPU build tested in CI; installed first (pip takes it from the local wheel), so the project's
# torch>=2.0 range is already met and nothing larger is downloaded
TORCH  ?= torch==2.13.0

.PHONY: demo test bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

$(VENV)/.installed: $(BIN)/python pyproject.toml
	$(BIN)/pip install -q '$(TORCH)'
	$(BIN)/pip install -q -e '.[all,test]'
	touch $@

demo: $(VENV)/.installed
	$(BIN)/stagewise demo

test: $(VENV)/.installed
	$(BIN)/python -m pytest -q

# every benchmark, one after another; writes benchmarks/RESULTS.md (NAMES="simulate render" for a subset)
bench: $(VENV)/.installed
	$(BIN)/python benchmarks/run_all.py $(NAMES)

clean:
	rm -rf $(VENV) stagewise-demo .pytest_cache .hypothesis

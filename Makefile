# Set-up is `make demo` or `make test`: both create .venv and install everything on first use.
PYTHON ?= python3
VENV := .venv
STAMP := $(VENV)/.installed-stamp
JOBS ?= auto

.PHONY: install demo test bench clean

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install -e '.[test,examples]'
	touch $(STAMP)

demo: install
	$(VENV)/bin/tpugen demo

test: install
	$(VENV)/bin/python -m pytest -n $(JOBS)

bench: install
	$(VENV)/bin/tpugen bench --out bench.json --plot bench.png

clean:
	rm -rf $(VENV) build *.egg-info

# The two commands of the README: `make run` and `make test`. Both install what they need first.
PYTHON ?= python3
PIP := $(PYTHON) -m pip
# The one torch pin, installed where no torch is. Which build comes is the package index's: PyPI's torch
# for Linux is the CUDA build (several GB); TORCH_INDEX=https://download.pytorch.org/whl/cpu takes the CPU
# build from PyTorch's own index. Install another build of torch first to keep it.
TORCH_VERSION := 2.13.0
TORCH_INDEX ?=
TORCH := $(PYTHON) -c "import torch" 2>/dev/null || $(PIP) install torch==$(TORCH_VERSION) \
	$(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))

.PHONY: run test install bench lint docs

install:
	@$(TORCH)
	$(PIP) install -e .

run: install
	$(PYTHON) -m dagrl run graphs/ppo-cartpole.yaml

test:
	@$(TORCH)
	$(PIP) install -e ".[test]"
	$(PYTHON) -m ruff check .
	$(PYTHON) -m ruff format --check .
	NO_MKDOCS_2_WARNING=1 $(PYTHON) -m mkdocs build --strict --quiet --site-dir build/site
	$(PYTHON) benchmarks/report.py --check
	$(PYTHON) -m pytest

bench:
	@$(TORCH)
	$(PIP) install -e ".[bench]"
	$(PYTHON) -m dagrl bench sampling
	$(PYTHON) -m dagrl bench ppo-cartpole
	$(PYTHON) -m dagrl bench replay
	$(PYTHON) -m dagrl bench sac-pendulum
	$(PYTHON) -m dagrl bench supervision
	$(PYTHON) -m dagrl bench sweep
	$(PYTHON) tests/debian.py chromium chromium
	$(PYTHON) -m dagrl bench dashboard

docs:  # the documentation site at http://127.0.0.1:8000, rebuilt as files change
	$(PIP) install -e ".[docs]"
	$(PYTHON) -m mkdocs serve

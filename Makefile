# The two commands of the README: `make run` and `make test`. Both install what they need first.
PYTHON ?= python3
PIP := $(PYTHON) -m pip
# CPU torch when none is installed; install a CUDA build of torch yourself beforehand for a GPU.
TORCH := $(PYTHON) -c "import torch" 2>/dev/null || $(PIP) install torch==2.13.0

.PHONY: run test install bench lint

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

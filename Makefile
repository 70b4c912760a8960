# emitter — one command each: `make demo` (set-up + emit + build a 3-kernel demo set, a few minutes on 2 cores),
# `make demo-all` (every example config: configs/gemm/*.yaml), `make test`.
PY      ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
OUT     ?= generated/demo
SPECS   ?= configs/gemm/*.yaml
DEMO_SPECS ?= configs/demo.yaml
JOBS    ?=

.PHONY: install install-base demo demo-all emit build verify profile test test-fast test-gpu bench bench-gpu bench-gpu-explore bench-attention bench-conv bench-conv-grouped bench-library perf-doc golden clean

install: $(VENV)/.installed $(VENV)/.installed-torch
$(VENV)/.installed: $(VENV)/.installed-base pyproject.toml
	$(BIN)/pip install -q -e '.[test]'
	touch $@

# torch runs the attention and conv torch references and the conv runner's planted-fault launches on the CPU
# in the tests. Installed only where the venv cannot import one already (a GPU machine's own CUDA torch stays),
# and pinned: an unpinned `torch` resolves to the newest multi-GB CUDA build. The CI machine has this release's
# CPU wheel on disk; elsewhere `make install TORCH_PIP_ARGS='--index-url https://download.pytorch.org/whl/cpu'`
# gets the CPU build, and TORCH= leaves torch out (its tests then skip).
TORCH          ?= torch==2.13.0
TORCH_PIP_ARGS ?=
$(VENV)/.installed-torch: $(VENV)/.installed-base
	$(if $(TORCH),$(BIN)/python -c 'import torch' 2>/dev/null || $(BIN)/pip install -q $(TORCH_PIP_ARGS) '$(TORCH)')
	touch $@

# install-base: emitter and the CUTLASS headers only, what `make demo` needs (the test extras, ray and matplotlib
# among them, add ~300 MB and most of the download time; `make install` / `make test` add them)
install-base: $(VENV)/.installed-base
$(VENV)/.installed-base: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e .
	$(BIN)/pip install -q --no-deps nvidia-cutlass==4.2.0.0   # the CUTLASS headers without scipy & co (pyproject.toml)
	touch $@

# demo: what a newcomer runs first (README): three sm80 kernels emitted, listed (with a rejected one and why) and
# built, then the next steps. The full example set is `make demo-all`.
demo: install-base
	$(BIN)/emitter emit $(DEMO_SPECS) -o $(OUT)
	$(BIN)/emitter list $(OUT)
	$(BIN)/emitter build $(OUT) $(if $(JOBS),-j $(JOBS))
	@echo
	@echo "next: on a GPU, check the kernels against a reference:  $(BIN)/emitter verify $(OUT) --quick"
	@echo "      (needs pip install pycuda; sm80 kernels also run on Hopper, through their PTX)"
	@echo "      edit the specs (README: Spec format) or start your own project:  $(BIN)/emitter init my-kernels"
	@echo "      every example config (about 26 kernels, 10-25 min on 2 cores):  make demo-all"

demo-all: build

emit: install
	$(BIN)/emitter emit $(SPECS) -o $(OUT)
	$(BIN)/emitter list $(OUT) --no-rejected

build: emit
	$(BIN)/emitter build $(OUT) $(if $(JOBS),-j $(JOBS))

verify: install          # needs a GPU and `pip install -e '.[gpu]'`
	$(BIN)/emitter verify $(OUT)

profile: install         # needs a GPU
	$(BIN)/emitter profile configs/profile/llm_shapes.yaml -o results

test: install
	$(BIN)/python -m pytest -q

test-fast: install       # everything but the nvcc compiles
	$(BIN)/python -m pytest -q -m "not nvcc"

test-gpu:                # on the GPU machine (see scripts/gpu_suite.sh)
	bash scripts/gpu_suite.sh

bench: install           # emit speed (10,000 instances) and build overhead against plain nvcc
	$(BIN)/python benchmarks/emit_speed.py
	$(BIN)/python benchmarks/build_overhead.py

# bench-gpu: the method of the runs in docs/performance.md (warm-up 25 ms of GPU time, 3 repeats of >= 10 ms,
# run-time swizzle x raster on each shape's 3 fastest kernels, then each winner against cuBLAS launch by launch in
# alternation, 5 rounds, each shape's 3 fastest kernels within 10% of the sweep's best, the best kept and timed
# again: profile_sm90a.py --confirm 5 --candidates 3, its defaults); on an H100 (run 2026-11-24c-h100, one
# candidate): 196 s of build, 23 of verify, 707 of profiling and 255 of confirmation; run 2026-11-24f-h100cand
# (mid-m shapes, 3 candidates): 226 s of confirmation for 60 rows
bench-gpu:               # on the GPU machine: build, verify and profile the sm90a configs vs cuBLAS (issue 6)
	python3 benchmarks/profile_sm90a.py --out results/sm90a --shapes all --doc docs/performance.md \
	  --repeats 3 --min-duration-ms 10 --warmup-ms 25 \
	  --scheduler '{swizzle: [null, 4, 8], raster: [null, along_m, along_n], top: 3}'

# bench-gpu-explore times every kernel on every shape at its compiled-in scheduler, then the 3 fastest of each
# shape again at run-time swizzle 1/4/8 x raster heuristic/along M/along N (scheduler `top: 3`), each distinct
# launch once: ~4.2k timings, counted with the fake backend (every variant on every kernel: ~12k; before
# duplicates were skipped, 5.9k and 16.5k).
bench-gpu-explore:       # on the GPU machine: bench-gpu plus the candidates of configs/tuning/sm90a_explore.yaml, every shape
	python3 benchmarks/profile_sm90a.py --out results/sm90a-explore --shapes all \
	  --specs configs/gemm/sm90a_bf16.yaml --specs configs/gemm/sm90a_fp8.yaml \
	  --specs configs/tuning/sm90a_candidates.yaml --specs configs/tuning/sm90a_explore.yaml \
	  --repeats 3 --min-duration-ms 10 --warmup-ms 25 \
	  --scheduler '{swizzle: [null, 4, 8], raster: [null, along_m, along_n], top: 3}'

bench-attention:         # on the GPU machine: emit, build, verify and time the sm90a attention anchor set vs torch SDPA (issue 27)
	python3 benchmarks/attention_bench.py --out results/attention -j 16 --doc docs/attention_performance.md

bench-conv:              # on the GPU machine: emit, build (-j 16), verify and time the ResNet-50 conv layers vs cuDNN (issue 28)
	python3 benchmarks/conv_bench.py --out $${OUT:-results}/conv -j 16 --doc docs/conv_performance.md

bench-conv-grouped:      # on the GPU machine: grouped / depthwise conv through the exported library vs cuDNN
	python3 benchmarks/conv_grouped_bench.py --out $${OUT:-results}/conv_grouped -j 16 --doc docs/conv_grouped_performance.md

# bench-library: the exported library as users get it, per family (configs/bench/library_<family>.yaml): emit the
# starter specs, emitter build + profile on a tuning set, export with that tuning + CMake, then the library's torch
# functions vs the vendor and vs every exported kernel forced by name (the oracle) on other shapes. Each stage is
# restartable: STAGE=build|profile|measure runs one stage (the work dir generated/libbench is kept between calls),
# FAMILY=gemm|attention|conv one family; a full build of the three takes longer than one 10-minute device call.
# CONFIG=configs/bench/library_conv_bf16.yaml runs that config instead (conv's bf16 set: work dir
# generated/libbench/conv-bf16, records conv-bf16-<date>-<gpu>.json, its own table).
# CONFIG=configs/bench/library_attention_backward.yaml: the attention backward (lib.attention_backward vs SDPA's
# backward, cuDNN and flash; work dir generated/libbench/attention-backward, its own record and table).
bench-library:           # on the GPU machine: docs/library_performance.md and docs/perf/library/<family>-<date>-<gpu>.json
	python3 benchmarks/library_bench.py --out generated/libbench -j 16 $(if $(FAMILY),--family $(FAMILY)) \
	  $(if $(CONFIG),--config $(CONFIG)) $(if $(STAGE),--stage $(STAGE)) --doc docs/library_performance.md

perf-doc: install        # no GPU: docs/performance.md from the run records in docs/perf/runs (oldest first), then RUN=<run dir> if given
	$(BIN)/python benchmarks/profile_sm90a.py $(foreach r,$(sort $(filter-out %.tuning.json,$(wildcard docs/perf/runs/*.json))) $(RUN),--report-only $(r)) --doc docs/performance.md

clean:
	rm -rf generated/demo results build dist .pytest_cache
GOLDEN_TESTS = tests/gemm/test_golden.py tests/attention/test_attention_render.py tests/attention/test_attention_sm90a.py \
	tests/conv/test_conv_render.py
golden: install          # rewrites tests/golden/<family>/<arch>/ from the templates; review the diff
	EMITTER_UPDATE_GOLDEN=1 $(BIN)/python -m pytest -q -p no:cacheprovider -k "matches_golden" $(GOLDEN_TESTS)

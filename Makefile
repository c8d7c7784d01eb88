# crosstrain: `make` builds, `make test` runs the suite, `make demo` runs the main job.
# Each first installs the Debian packages that are missing (scripts/install-deps.sh).
BUILD ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?= -DCMAKE_BUILD_TYPE=RelWithDebInfo

.PHONY: all deps deps-core build app test test-all demo demo-comm bench-comm bench-ddp bench-pipeline bench-memory-layouts bench-memory bench-checkpoint bench-comm-compare bench-compression bench-wan bench-chaos bench-chaos-wan bench-secure bench-trace bench-attention bench-scale bench-plan tokens bench-models bench-recsys bench-scheduler install clean

all: build

deps:
	@scripts/install-deps.sh

# What the binaries and the demo need, without the test suite's browser and Slurm clusters.
deps-core:
	@scripts/install-deps.sh --core

$(BUILD)/CMakeCache.txt:
	@cmake -S . -B $(BUILD) $(CMAKE_FLAGS) > /dev/null

build: deps $(BUILD)/CMakeCache.txt
	@cmake --build $(BUILD) -j $(JOBS) -- --no-print-directory

# The library and the binaries only (crosstrain, the testbed's delay relay): no test suite.
app: deps-core $(BUILD)/CMakeCache.txt
	@cmake --build $(BUILD) -j $(JOBS) --target crosstrain_app crosstrain-delay-relay -- --no-print-directory

# Everything but the `slow` label; ranks are processes, so two at a time is the limit on 2 cores.
test: build
	@start=$$(date +%s); cd $(BUILD) && ctest -j2 -LE slow --output-on-failure --timeout 900; status=$$?; \
	  echo "make test: the suite took $$(( $$(date +%s) - start )) s (make test-all adds the slow label)"; exit $$status

test-all: build
	@cd $(BUILD) && ctest -j2 --output-on-failure

# Trains gpt-tiny on 2 data-parallel ranks and prints a sample of generated text.
demo: app
	@rm -rf runs/demo
	@$(BUILD)/crosstrain train recipes/gpt-tiny.toml --nproc 2 --set run.dir=runs/demo

# SentencePiece tokens of the demo corpus for recipes/gpt-tiny-sp.toml (docs/tokenization.md).
tokens: app
	@$(BUILD)/crosstrain tokenize /usr/share/games/fortunes --out data/fortunes-sp --vocab-size 2048

demo-comm: app
	@$(BUILD)/crosstrain demo --nproc 2

bench-comm: build
	@$(BUILD)/crosstrain bench comm --op all --nproc 2 --sizes 4:16M --step-factor 4

# Gradient codecs: bytes per step and loss against uncompressed training.
bench-compression: build
	@bench/compression.sh

# Every all-reduce path (Gloo, shared memory, our algorithms) on the same sizes, busbw side by side.
bench-comm-compare: build
	@bench/comm_compare.sh

# crosstrain against PyTorch's DistributedDataParallel (Debian's python3-torch), same shape, 2 ranks.
bench-ddp: build
	@scripts/install-deps.sh python3-torch
	@bench/bench_ddp.sh

# Pipeline bubble of each schedule: measured on real processes next to (p-1)/m and friends.
bench-pipeline: build
	@$(BUILD)/crosstrain bench pipeline --stages 2,4 --microbatches 4,8 --trace runs/pipeline-traces

# Rank 0's parameter bytes and peak memory for each 4-rank layout.
bench-memory-layouts: build
	@bench/memory_layouts.sh

# ZeRO stages 0-3 at dp=2 and dp=4: measured model-state bytes per parameter next to the formula.
bench-memory: build
	@bench/memory.sh

# Checkpoint cost per step: none, synchronous, asynchronous (background writer).
bench-checkpoint: build
	@bench/checkpoint_overhead.sh

# Every sync.mode across emulated clusters (2 x 2 hosts, 100 Mbit/s, 25 ms; needs root): wan bytes, time, loss.
bench-wan: build
	@BUILD=$(BUILD) bench/wan.sh

# Elastic training under faults: gpt-tiny on 4 replicas while ranks are killed and stopped (several minutes).
bench-chaos: build
	@python3 bench/chaos.py --bin $(BUILD)/crosstrain

# The same across the emulated wide-area testbed (root): DiLoCo over 3 clusters x 2 hosts while ranks, hosts, a
# cluster and links fail (two runs of about 10 minutes each).
bench-chaos-wan: build
	@python3 bench/chaos_wan.py --bin $(BUILD)/crosstrain --build $(BUILD)

# The sealed data plane (comm.encrypt): AEAD rate of a core, loopback all-reduce bus bandwidth sealed against
# plain, DiLoCo across the emulated wide-area testbed sealed against plain (root; about 10 minutes).
bench-secure: build
	@BUILD=$(BUILD) bench/secure.sh

# Cost of always-on traces: gpt-tiny on 2 ranks with obs.trace on and off in alternating rounds; trace size.
bench-trace: build
	@python3 bench/trace.py --bin $(BUILD)/crosstrain

# Fused causal attention against the reference path (matmul, mask, softmax, matmul), forward + backward.
bench-attention: build
	@BIN=$(BUILD)/crosstrain bench/attention.sh

# A GPT of about 350M parameters on 4 ranks (pp=2 x tp=2): each rank's peak RSS against one process's need;
# full recompute's activation bytes and step time against none.
bench-scale: build
	@BIN=$(BUILD)/crosstrain bench/scale.sh

# The planner against real runs (issue 16): this host calibrated, 29 layouts of gpt-tiny trained for 30 steps
# and predicted (the two WAN runs need root); predicted_s, measured_s, err_pct, best-layout hits. About 15 minutes.
bench-plan: build
	@python3 bench/plan.py --bin $(BUILD)/crosstrain

# gpt-tiny against llama-tiny at equal parameter count on the SentencePiece tokens (tokens/s ratio).
bench-models: app
	@test -f data/fortunes-sp/train.bin || $(BUILD)/crosstrain tokenize /usr/share/games/fortunes --out data/fortunes-sp --vocab-size 2048
	@python3 bench/models.py --bin $(BUILD)/crosstrain

# DLRM (issue 18): examples/s on 1 and 2 ranks with sharded tables (alternating, medians, speedup), all-to-all
# bytes per step; then parameter-server tables in mmap files more than 4x a rank's memory budget (AUC). ~3 minutes.
bench-recsys: app
	@python3 bench/recsys.py --bin $(BUILD)/crosstrain

# The scheduler (issue 19): 1,000 gang jobs onto 6 simulated clusters through placement, the SQLite state on disk
# (build/bench-scheduler.db) and one cluster lost half-way. A few seconds. Then a real job's shrink_s and grow_back_s.
bench-scheduler: app
	@$(BUILD)/crosstrain bench scheduler --jobs 1000 --clusters 6 --state $(BUILD)/bench-scheduler.db
	@echo "live shrink and grow of a real DiLoCo job across two local clusters (about 20 s):"
	@cmake --build $(BUILD) --target live_elastic_tests > /dev/null
	@$(BUILD)/tests/live_elastic_tests --gtest_brief=1 | grep -E '^shrink_s=|FAILED'

install: build
	@cmake --install $(BUILD) $(if $(PREFIX),--prefix $(PREFIX),)

clean:
	@rm -rf $(BUILD)

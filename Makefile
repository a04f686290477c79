# kvant build.  `make` builds build/kvant and build/libkvant.a.
# `make test` does all set-up (Debian packages, Python venv, default model),
# then builds and runs every test: unit tests, Python reference tests,
# the ASan+UBSan run and a bounded fuzz run.
#
# Sources are discovered: every src/**/*.c except src/cli (the binary) and
# src/backend/cuda (CUDA=1 only) goes into libkvant.a.  Files ending in
# _avx2.c / _avx512.c get the matching -m flags and are chosen at run time.
# Each tests/unit/test_*.c is one test program, linked with libkvant.a;
# it fails through its exit code.

CC      ?= cc
BUILD   ?= build
PY      := .venv/bin/python
MODEL   := models/SmolLM2-135M-Instruct.Q4_1.gguf

WARN    := -Wall -Wextra -Wshadow -Wmissing-prototypes -Wno-unused-parameter
OPT     ?= -O2 -g
CFLAGS  := $(OPT) -std=c11 -D_GNU_SOURCE -pthread $(WARN) -Isrc $(EXTRA_CFLAGS)
ifeq ($(WERROR),1)
CFLAGS  += -Werror
endif
LDLIBS  := -lpcre2-8 -ljansson -lmicrohttpd -lm -pthread

AVX2_FLAGS   := -mavx2 -mfma -mf16c
AVX512_FLAGS := -mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx512vnni -mavx2 -mfma -mf16c

LIB_SRC  := $(shell find src -name '*.c' -not -path 'src/cli/*' -not -path 'src/backend/cuda/*' | sort)
# The x86 SIMD files only where the compiler targets x86-64; elsewhere
# (arm64, ...) the scalar kernels are the only ones (src/util/arch.h).
TARGET   := $(shell $(CC) -dumpmachine 2>/dev/null)
ifeq ($(findstring x86_64,$(TARGET)),)
LIB_SRC  := $(filter-out %_avx2.c %_avx512.c,$(LIB_SRC))
endif
# MPI (tensor and pipeline parallelism, src/par): built in where mpicc is
# found (OpenMPI, installed by scripts/setup-deps.sh); MPI=0 builds the
# single-process stub (the arm64 cross build uses it).
MPI      ?= $(if $(shell command -v mpicc 2>/dev/null),1,0)
ifeq ($(MPI),1)
LIB_SRC  := $(filter-out src/par/par_none.c,$(LIB_SRC))
MPI_CFLAGS := $(shell mpicc --showme:compile)
LDLIBS   += $(shell mpicc --showme:link)
else
LIB_SRC  := $(filter-out src/par/par_mpi.c,$(LIB_SRC))
endif
CLI_SRC  := $(sort $(wildcard src/cli/*.c))
TEST_SRC := $(sort $(wildcard tests/unit/test_*.c))
TESTUTIL := $(filter-out $(TEST_SRC),$(wildcard tests/unit/*.c))

LIB_OBJ  := $(LIB_SRC:%.c=$(BUILD)/obj/%.o)
CLI_OBJ  := $(CLI_SRC:%.c=$(BUILD)/obj/%.o)
TU_OBJ   := $(TESTUTIL:%.c=$(BUILD)/obj/%.o)
TEST_BIN := $(TEST_SRC:tests/unit/%.c=$(BUILD)/tests/%)

ifeq ($(CUDA),1)
NVCC     ?= nvcc
CU_SRC   := $(shell find src/backend/cuda -name '*.cu' 2>/dev/null | sort)
CU_CSRC  := $(shell find src/backend/cuda -name '*.c' 2>/dev/null | sort)
LIB_OBJ  += $(CU_SRC:%.cu=$(BUILD)/obj/%.o) $(CU_CSRC:%.c=$(BUILD)/obj/%.o)
CFLAGS   += -DKVANT_CUDA=1
ifeq ($(CUDA_HOST),1)
# The host build (`make cuda-host`): the .cu files compiled as C++ by the
# host compiler over the shim in tests/cuda_host (its cuda_runtime.h,
# cublas_v2.h, cuda_fp16.h and nccl.h stand for the toolkit's).
CXX      ?= g++
CU_CXXFLAGS := $(OPT) -std=c++17 -pthread -x c++ -ffp-contract=off -Itests/cuda_host -Isrc \
               -Wall -Wextra -Wshadow -Wno-unused-parameter -Wno-unknown-pragmas \
               -Wno-missing-field-initializers -Wno-format-truncation -DKVANT_CUDA=1
ifeq ($(WERROR),1)
CU_CXXFLAGS += -Werror
endif
CU_COMPILE = $(CXX) $(CU_CXXFLAGS) -MMD -MP
CUHOST_OBJ := $(patsubst %.cc,$(BUILD)/obj/%.o,$(wildcard tests/cuda_host/cuda_host*.cc))
LIB_OBJ  += $(CUHOST_OBJ)
LDLIBS   += -lstdc++ -ldl
else
# ptxas reports every spill and every use of local memory (a stack frame)
# at sm_80 and sm_90; with WERROR=1 (`make cuda-build`, part of `make
# test`) either fails the build.
comma    := ,
CU_PTXAS := -Xptxas -warn-spills,-warn-lmem-usage$(if $(filter 1,$(WERROR)),$(comma)-Werror)
CU_COMPILE = $(NVCC) -O2 -Isrc -MMD -MP -gencode arch=compute_80,code=sm_80 \
             -gencode arch=compute_90,code=sm_90 $(CU_PTXAS)
LDLIBS   += -L/usr/local/cuda/lib64 -lcudart -lcublas -lnccl -lstdc++
endif
endif

.PHONY: all lib layers test unit unit-isa pytest pytest-isa asan fuzz fuzz-run cuda-build cuda-host arm64 deps venv model peer-src guidellm-venv serve clean

all: $(BUILD)/kvant

lib: $(BUILD)/libkvant.a

$(BUILD)/obj/%_avx2.o: %_avx2.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(AVX2_FLAGS) -MMD -MP -c $< -o $@

$(BUILD)/obj/%_avx512.o: %_avx512.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(AVX512_FLAGS) -MMD -MP -c $< -o $@

$(BUILD)/obj/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -MMD -MP -c $< -o $@

$(BUILD)/obj/src/par/par_mpi.o: CFLAGS += $(MPI_CFLAGS)

$(BUILD)/obj/%.o: %.cu
	@mkdir -p $(dir $@)
	$(CU_COMPILE) -c $< -o $@

$(BUILD)/obj/tests/cuda_host/%.o: tests/cuda_host/%.cc
	@mkdir -p $(dir $@)
	$(CU_COMPILE) -c $< -o $@

# The shim's own checks (warp values, barriers, launch limits, faults).
$(BUILD)/tests/cuda_shim_test: tests/cuda_host/shim_test.cc $(CUHOST_OBJ)
	@mkdir -p $(dir $@)
	$(CU_COMPILE) -o $@ $< -x none $(CUHOST_OBJ) -ldl

$(BUILD)/libkvant.a: $(LIB_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/kvant: $(CLI_OBJ) $(BUILD)/libkvant.a
	$(CC) $(CFLAGS) -o $@ $(CLI_OBJ) $(BUILD)/libkvant.a $(LDFLAGS) $(LDLIBS)

# A test build of the binary: engine.c with KVANT_TEST_HOOKS (the engine can
# be frozen from a test, tests/py/test_health.py).  Its engine.o comes
# first, so the archive's is never linked.  build/kvant has no hooks.
$(BUILD)/obj/testhooks/engine.o: src/engine/engine.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -DKVANT_TEST_HOOKS=1 -MMD -MP -c $< -o $@

$(BUILD)/kvant-testhooks: $(CLI_OBJ) $(BUILD)/obj/testhooks/engine.o $(BUILD)/libkvant.a
	$(CC) $(CFLAGS) -o $@ $(CLI_OBJ) $(BUILD)/obj/testhooks/engine.o $(BUILD)/libkvant.a \
	  $(LDFLAGS) $(LDLIBS)

# Tools the scripts run (not unit tests: scripts/run-unit.sh runs test_*).
$(BUILD)/tests/cuda_bench: tests/tools/cuda_bench.c $(TU_OBJ) $(BUILD)/libkvant.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Itests/unit -o $@ $< $(TU_OBJ) $(BUILD)/libkvant.a $(LDFLAGS) $(LDLIBS)

$(BUILD)/tests/qact_bench: tests/tools/qact_bench.c $(TU_OBJ) $(BUILD)/libkvant.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Itests/unit -o $@ $< $(TU_OBJ) $(BUILD)/libkvant.a $(LDFLAGS) $(LDLIBS)

$(BUILD)/tests/%: tests/unit/%.c $(TU_OBJ) $(BUILD)/libkvant.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Itests/unit -o $@ $< $(TU_OBJ) $(BUILD)/libkvant.a $(LDFLAGS) $(LDLIBS)

# test_engine_alloc counts the allocator calls an engine step makes: every
# reference to these functions, from the test and from libkvant.a, goes to
# the test's __wrap_ counters (ld --wrap; works under ASan too).
ALLOC_WRAP := malloc calloc realloc free posix_memalign aligned_alloc memalign valloc \
              reallocarray strdup strndup
$(BUILD)/tests/test_engine_alloc: LDFLAGS += $(foreach f,$(ALLOC_WRAP),-Wl,--wrap=$(f))

-include $(shell find $(BUILD)/obj -name '*.d' 2>/dev/null)

# The dashboard page is embedded with .incbin (server_dash.c).
$(BUILD)/obj/src/server/server_dash.o: src/server/dashboard.html

# ---- set-up (idempotent; installs only what is missing) ----
deps:
	@scripts/setup-deps.sh

venv: .venv/.stamp
.venv/.stamp: tests/requirements.txt
	@scripts/setup-venv.sh
	@touch $@

model: $(MODEL)
$(MODEL):
	@scripts/fetch-model.sh

# The peer's source and test data (tokenizer vectors, chat templates):
# llama-cpp-python 0.3.36's sdist from PyPI, sha256-checked, under build/peer.
peer-src:
	@scripts/fetch-peer-src.sh

# guidellm 0.8.1 (pinned, tests/requirements-guidellm.txt) in its own venv,
# build/guidellm-venv, and its tokenizer built offline from the default
# model's GGUF into build/guidellm-tok (tests/py/test_guidellm.py).
guidellm-venv: model
	@scripts/setup-guidellm.sh

# ---- tests ----
# test_tokenizer reads the large llama.cpp vocabularies from build/peer.
unit: $(BUILD)/kvant $(TEST_BIN) peer-src
	@scripts/run-unit.sh $(BUILD)

# PYTEST_JOBS tests at once (pytest-xdist; default 2): on two cores a lone
# pytest kept them 74% busy (one minute sampled) while its tests wait on
# servers, sockets and timeouts.  PYTEST_JOBS=0 runs them one at a time.
# Tests marked `alone` (timing-sensitive: test_hostile's TTFT ratios) run
# afterwards by themselves.
PYTEST_JOBS ?= 2
pytest: $(BUILD)/kvant $(BUILD)/kvant-testhooks venv model peer-src guidellm-venv
	KVANT_BIN=$(BUILD)/kvant $(PY) -m pytest -q -n $(PYTEST_JOBS) -m "not alone" tests/py
	KVANT_BIN=$(BUILD)/kvant $(PY) -m pytest -q -m alone tests/py

# Every instruction set the CPU has, besides the automatic choice that
# `unit` and `pytest` ran: the unit tests, and the end-to-end reference
# tests (numpy float64 forward pass) on each.  An ISA the CPU lacks is
# named and not run (KVANT_ISA refuses it).
ALL_ISAS := scalar avx2 avx512
unit-isa: $(BUILD)/kvant $(TEST_BIN) peer-src
	@auto=$$(env -u KVANT_ISA $(BUILD)/kvant --isa); for isa in $(ALL_ISAS); do \
	  if [ "$$isa" = "$$auto" ]; then continue; fi; \
	  if KVANT_ISA=$$isa $(BUILD)/kvant --help >/dev/null 2>&1; then \
	    KVANT_ISA=$$isa scripts/run-unit.sh $(BUILD) || exit 1; \
	  else echo "unit-isa: this CPU lacks $$isa: not run"; fi; done

pytest-isa: $(BUILD)/kvant venv model
	@auto=$$(env -u KVANT_ISA $(BUILD)/kvant --isa); for isa in $(ALL_ISAS); do \
	  if [ "$$isa" = "$$auto" ]; then continue; fi; \
	  if KVANT_ISA=$$isa $(BUILD)/kvant --help >/dev/null 2>&1; then \
	    echo "pytest-isa: reference tests with KVANT_ISA=$$isa"; \
	    KVANT_ISA=$$isa KVANT_BIN=$(BUILD)/kvant $(PY) -m pytest -q \
	      tests/py/test_logits.py tests/py/test_default_model.py tests/py/test_pack.py || exit 1; \
	  else echo "pytest-isa: this CPU lacks $$isa: not run"; fi; done

# arm64: a cross build whose unit tests run under qemu-user (Debian's
# gcc-aarch64-linux-gnu, qemu-user and the :arm64 -dev libraries, installed
# by scripts/setup-deps.sh).  Scalar kernels only.  The tests in
# ARM64_NOT_RUN are built but not run there (they run natively above): they
# start threads (thread pool, roofline, disk writer), and a pthread_create
# under Debian 12's qemu-aarch64 here does not return, or they time kernels
# for minutes under emulation.
# -fno-tree-vectorize: Debian 12's aarch64 gcc 12.2 hits an internal
# compiler error vectorizing a reduction in tests/unit/test_sampler.c.
ARM64_CC ?= aarch64-linux-gnu-gcc
ARM64_SYSROOT ?= /usr/aarch64-linux-gnu
ARM64_NOT_RUN := test_bench test_cuda test_cuda_tier test_dtype test_engine test_engine_alloc test_engine_gram test_engine_itl test_engine_kvb test_engine_spec test_engine_tier \
                 test_cpu_fuse test_kvcompact test_kvq test_kvsnap test_kvtier test_kvresize test_models test_prune test_tpool \
                 test_wstream
ARM64_TESTS := $(filter-out $(ARM64_NOT_RUN),$(TEST_SRC:tests/unit/%.c=%))
arm64: peer-src
	rm -rf build-arm64/tests
	$(MAKE) CC=$(ARM64_CC) BUILD=build-arm64 MPI=0 WERROR=1 OPT="-O2 -g -fno-tree-vectorize" build-arm64/kvant \
	  $(ARM64_TESTS:%=build-arm64/tests/%) $(ARM64_NOT_RUN:%=build-arm64/obj/tests/unit/%.o)
	@echo "arm64: built, not run under qemu (threads hang there, or too slow emulated): $(ARM64_NOT_RUN)"
	KVANT_TEST_TIMEOUT=600 KVANT_TEST_RUNNER="qemu-aarch64 -L $(ARM64_SYSROOT)" \
	  scripts/run-unit.sh build-arm64

# The unit tests under ASan + UBSan, then (with MPI) --tp/--pp runs of real
# MPI ranks under the same sanitizers (scripts/asan-mpi.sh).
ASAN_OPT := -O1 -g -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
asan: model
	$(MAKE) BUILD=build-asan WERROR=1 OPT="$(ASAN_OPT)" unit
	@if [ "$(MPI)" = 1 ]; then scripts/asan-mpi.sh build-asan; \
	else echo "asan: built without MPI (no mpicc): the --tp/--pp sanitizer run is not done"; fi

# The floors of src/FLOORS, no rings between modules (includes and the
# objects' symbols), file and function lengths (scripts/check-layers).
layers: $(BUILD)/libkvant.a
	scripts/check-layers --objects $(BUILD)

fuzz:
	$(MAKE) -f fuzz/fuzz.mk

fuzz-run: fuzz model peer-src
	@scripts/run-fuzz.sh 60

# The CUDA backend compiles and links wherever nvcc is installed (no GPU
# needed), and each kernel's registers, stack, local and shared memory are
# checked against their budgets (scripts/check-cuda-resources, cuobjdump
# from the venv); without nvcc this says so and skips.
cuda-build: venv
	@if command -v $(or $(NVCC),nvcc) >/dev/null 2>&1; then \
	  $(MAKE) CUDA=1 BUILD=build-cuda WERROR=1 build-cuda/kvant build-cuda/tests/test_cuda \
	    build-cuda/tests/test_cuda_tier \
	    build-cuda/tests/cuda_bench && \
	  scripts/check-cuda-resources build-cuda; \
	else echo "cuda-build: SKIPPED (nvcc not found)"; fi

# The CUDA backend's kernels and host code built with the host compiler
# over a shim (tests/cuda_host, docs/CUDA.md: each CUDA thread a fiber,
# lazy streams, launch limits checked) and the whole test_cuda run on it
# under ASan + UBSan.  Needs only g++ (no nvcc, no GPU).
# x86-64 only (the shim's context switch).
cuda-host:
ifneq ($(findstring x86_64,$(TARGET)),)
	$(MAKE) CUDA=1 CUDA_HOST=1 BUILD=build-cuda-host WERROR=1 OPT="$(ASAN_OPT)" \
	  build-cuda-host/tests/cuda_shim_test build-cuda-host/tests/test_cuda \
	  build-cuda-host/tests/test_cuda_tier build-cuda-host/tests/cuda_bench
	build-cuda-host/tests/cuda_shim_test
	build-cuda-host/tests/test_cuda
	build-cuda-host/tests/test_cuda_tier
else
	@echo "cuda-host: SKIPPED (the shim's fibers are x86-64 only; compiler targets $(TARGET))"
endif

# guidellm's venv (a large download, ~10 min) is set up in the background
# while the builds and unit tests run; `pytest` waits for it (a lock).
# Each stage's builds run TEST_JOBS compiles at once (default: the cores);
# each stage prints how long it took.
TEST_JOBS ?= $(shell nproc 2>/dev/null || echo 2)
stage = @t0=$$(date +%s); $(MAKE) -j$(TEST_JOBS) $(1) && \
	echo "test: stage '$(strip $(1))' passed in $$(( $$(date +%s) - t0 )) s"
test: deps venv model peer-src
	@mkdir -p build; (scripts/setup-guidellm.sh > build/guidellm-setup.log 2>&1 &); \
	  echo "test: setting up build/guidellm-venv in the background (build/guidellm-setup.log)"
	$(call stage,WERROR=1 all)
	$(call stage,layers)
	$(call stage,WERROR=1 unit)
	$(call stage,WERROR=1 unit-isa)
	$(call stage,pytest)
	$(call stage,pytest-isa)
	$(call stage,asan)
	$(call stage,arm64)
	$(call stage,fuzz-run)
	$(call stage,cuda-build)
	$(call stage,cuda-host)

serve: deps model
	$(MAKE) all
	$(BUILD)/kvant serve -m $(MODEL)

clean:
	rm -rf build build-asan build-fuzz build-cuda build-cuda-host build-arm64

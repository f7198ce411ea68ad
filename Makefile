# SparseK build.
#
#   make            library (build/libsparsek.so, .a), CLI (build/sparsek), CPU tests
#   make run        build, then `sparsek run` on the default workload
#   make test       build, then every test that runs without a GPU: the CPU
#                   tests, the same under ASan+UBSan, the CLI tests, the
#                   Python tests, the install test and the fuzz harnesses
#                   (FUZZ_TEST_SECONDS each, on their committed corpus; the
#                   binding's atheris harness FUZZ_PYTHON_TEST_SECONDS)
#   make gpu-test   build and run the GPU test suite (needs a GPU)
#   make watchdog   build-watchdog/sk_gpu_tests: the GPU suite, Hopper mbarrier waits bounded
#   make fuzz       the libFuzzer harnesses of tests/fuzz/, FUZZ_SECONDS each
#                   (clang; see docs/reliability.md); make fuzz-python, the
#                   binding's atheris harness, FUZZ_PYTHON_TIME
#   make install    PREFIX=/usr/local (and DESTDIR): header, libraries, CLI,
#                   pkg-config file and CMake package (see "Install" below)
#
# The Python tests run on $(PYTHON) when numpy and pytest import there;
# otherwise on a venv, build/venv, made once with both from PyPI.
#
# CUDA sources are compiled whenever nvcc is found, for sm_80 and sm_90a,
# GPU or not. Set NVCC= (empty) to build without CUDA.

NVCC ?= $(shell command -v nvcc 2>/dev/null)
CUDA_HOME ?= $(patsubst %/bin/nvcc,%,$(realpath $(NVCC)))
CC ?= gcc
PYTHON ?= python3
JOBS ?= $(shell nproc 2>/dev/null || echo 2)

BUILD := build
WARN := -Wall -Wextra -Wpedantic -Wshadow -Wstrict-prototypes -Wmissing-prototypes -Werror
CFLAGS_COMMON := -std=c99 -D_POSIX_C_SOURCE=200809L $(WARN) -Iinclude -Isrc -fopenmp -MMD -MP
CFLAGS := -O2 -g -fPIC -fvisibility=hidden $(CFLAGS_COMMON)
SAN := -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer
CFLAGS_ASAN := -O1 -g $(SAN) $(CFLAGS_COMMON) -DSK_NO_CUDA
LDLIBS := -fopenmp -lm

# Portable kernels: sm_80 machine code plus sm_90a (sm_80 code does not run on
# Hopper). Files named *_sm90*.cu hold Hopper-only kernels: sm_90a alone.
# CUDA sources live in one folder per family: src/cuda/<family>/*.cu.
GENCODE_PORTABLE := -gencode=arch=compute_80,code=sm_80 -gencode=arch=compute_90a,code=sm_90a
GENCODE_HOPPER := -gencode=arch=compute_90a,code=sm_90a
NVCC_WERROR := --Werror all-warnings
NVCCFLAGS := -O3 -std=c++17 -Iinclude -Isrc -Xcompiler -fPIC,-fvisibility=hidden \
	$(NVCC_WERROR) -Xptxas -v,--warn-on-spills -lineinfo $(NVCC_EXTRA)

CORE_SRC := $(sort $(wildcard src/core/*.c) $(wildcard src/cpu/*.c))
CUDA_SRC := $(sort $(wildcard src/cuda/*/*.cu))
# Shared by the CPU and GPU test runners: harness, naive fp64 references
# (attention, GEMM, top-k), helpers.
TEST_COMMON_SRC := $(sort $(wildcard tests/common/*.c))
TEST_SRC := $(sort $(wildcard tests/cpu/*.c)) $(TEST_COMMON_SRC)
GPU_TEST_SRC := $(sort $(wildcard tests/gpu/*.c)) $(TEST_COMMON_SRC)
# The CLI, one file per job; tools/common/host_data.h (fp16/bf16, the seeded
# generator) is shared with the bench programs.
CLI_SRC := $(sort $(wildcard tools/sparsek/*.c))
TOOLS_INC := -Itools/common

ifeq ($(strip $(NVCC)),)
HAVE_CUDA := 0
CFLAGS += -DSK_NO_CUDA
CUDA_OBJ :=
CUDA_LIBS :=
else
HAVE_CUDA := 1
CFLAGS += -isystem $(CUDA_HOME)/include
CUDA_OBJ := $(patsubst src/%.cu,$(BUILD)/obj/%.o,$(CUDA_SRC))
CUDA_LIBS := -L$(CUDA_HOME)/lib64 -lcudart_static -lrt -lpthread -ldl -lstdc++
endif

CORE_OBJ := $(patsubst src/%.c,$(BUILD)/obj/%.o,$(CORE_SRC))
ASAN_OBJ := $(patsubst src/%.c,$(BUILD)/asan/%.o,$(CORE_SRC))
TEST_OBJ := $(patsubst %.c,$(BUILD)/obj/%.o,$(TEST_SRC))
ASAN_TEST_OBJ := $(patsubst %.c,$(BUILD)/asan/%.o,$(TEST_SRC))
LIB_OBJ := $(CORE_OBJ) $(CUDA_OBJ)
CLI_OBJ := $(patsubst %.c,$(BUILD)/obj/%.o,$(CLI_SRC))
# All of the CLI but main(): its check test links these.
CLI_CORE_OBJ := $(filter-out %/main.o,$(CLI_OBJ))

.PHONY: all lib run test test-c test-asan test-cli test-python gpu-test watchdog format clean
all: lib $(BUILD)/sparsek $(BUILD)/sk_tests $(BUILD)/test_cli_check

lib: $(BUILD)/libsparsek.so $(BUILD)/libsparsek.a

$(BUILD)/obj/%.o: src/%.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

$(BUILD)/obj/tests/%.o: tests/%.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Itests $(TOOLS_INC) -c $< -o $@

$(BUILD)/obj/tools/%.o: tools/%.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(TOOLS_INC) -c $< -o $@

# The CLI's own tests build on its files.
$(BUILD)/obj/tests/cli/%.o: tests/cli/%.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Itools/sparsek $(TOOLS_INC) -c $< -o $@

# Every CUDA object keeps its ptxas report (registers, spills, stack) in
# build/ptxas/<family>/, the evidence for "no spills, no local memory".
CUDA_HEADERS := $(wildcard src/cuda/*.h src/cuda/*/*.h src/cuda/*/*.cuh src/core/*.h)
$(BUILD)/obj/cuda/%.o: src/cuda/%.cu $(CUDA_HEADERS) include/sparsek.h
	@mkdir -p $(dir $@) $(dir $(BUILD)/ptxas/$*)
	$(NVCC) $(NVCCFLAGS) $(if $(findstring _sm90,$(notdir $*)),$(GENCODE_HOPPER),$(GENCODE_PORTABLE)) \
		-c $< -o $@ 2> $(BUILD)/ptxas/$*.log || { cat $(BUILD)/ptxas/$*.log; exit 1; }
	@grep -i -E "warning|error" $(BUILD)/ptxas/$*.log || true

$(BUILD)/asan/%.o: src/%.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ASAN) -c $< -o $@

$(BUILD)/asan/tests/%.o: tests/%.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ASAN) -Itests $(TOOLS_INC) -c $< -o $@

$(BUILD)/libsparsek.so: $(LIB_OBJ)
	$(CC) -shared -o $@ $^ $(CUDA_LIBS) $(LDLIBS)

$(BUILD)/libsparsek.a: $(LIB_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/sparsek: $(CLI_OBJ) $(BUILD)/libsparsek.a
	$(CC) -o $@ $^ $(CUDA_LIBS) $(LDLIBS)

$(BUILD)/test_cli_check: $(BUILD)/obj/tests/cli/test_check.o $(CLI_CORE_OBJ) $(BUILD)/libsparsek.a
	$(CC) -o $@ $^ $(CUDA_LIBS) $(LDLIBS)

$(BUILD)/sk_tests: $(TEST_OBJ) $(BUILD)/libsparsek.a
	$(CC) -o $@ $^ $(CUDA_LIBS) $(LDLIBS)

$(BUILD)/sk_tests_asan: $(ASAN_TEST_OBJ) $(ASAN_OBJ)
	$(CC) $(SAN) -o $@ $^ $(LDLIBS)

$(BUILD)/sk_gpu_tests: $(patsubst %.c,$(BUILD)/obj/%.o,$(GPU_TEST_SRC)) $(BUILD)/libsparsek.a
	$(CC) -o $@ $^ $(CUDA_LIBS) $(LDLIBS)

# Benchmark programs (bench/*.c): GPU timing, built on demand.
$(BUILD)/obj/bench/%.o: bench/%.c include/sparsek.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(TOOLS_INC) -c $< -o $@

$(BUILD)/gemm_speed: $(BUILD)/obj/bench/gemm_speed.o $(BUILD)/libsparsek.a
	$(CC) -o $@ $^ $(CUDA_LIBS) $(LDLIBS)

$(BUILD)/attention_bwd_speed: $(BUILD)/obj/bench/attention_bwd_speed.o $(BUILD)/libsparsek.a
	$(CC) -o $@ $^ $(CUDA_LIBS) $(LDLIBS)

$(BUILD)/topk_speed: $(BUILD)/obj/bench/topk_speed.o $(BUILD)/libsparsek.a
	$(CC) -o $@ $^ $(CUDA_LIBS) $(LDLIBS)

# The decode attention's speed rows (issue 31): make build/decode_speed.
$(BUILD)/decode_speed: $(BUILD)/obj/bench/decode_speed.o $(BUILD)/libsparsek.a
	$(CC) -o $@ $^ $(CUDA_LIBS) $(LDLIBS)

$(BUILD)/varlen_speed: $(BUILD)/obj/bench/varlen_speed.o $(BUILD)/libsparsek.a
	$(CC) -o $@ $^ $(CUDA_LIBS) $(LDLIBS)

# The varlen backward against the fixed backward (issue 30): make build/varlen_bwd_speed.
$(BUILD)/varlen_bwd_speed: $(BUILD)/obj/bench/varlen_bwd_speed.o $(BUILD)/libsparsek.a
	$(CC) -o $@ $^ $(CUDA_LIBS) $(LDLIBS)

$(BUILD)/decode_select_speed: $(BUILD)/obj/bench/decode_select_speed.o $(BUILD)/libsparsek.a
	$(CC) -o $@ $^ $(CUDA_LIBS) $(LDLIBS)

$(BUILD)/attention_fp8_speed: $(BUILD)/obj/bench/attention_fp8_speed.o $(BUILD)/libsparsek.a
	$(CC) -o $@ $^ $(CUDA_LIBS) $(LDLIBS)

# The context-parallel speed rows over NCCL (issue 33): make build/cp_speed.
$(BUILD)/cp_speed: $(BUILD)/obj/bench/cp_speed.o $(BUILD)/libsparsek.a
	$(CC) -o $@ $^ $(CUDA_LIBS) $(LDLIBS)

# The fingerprint of every GPU output on fixed cases (tests/bitwise/): two
# builds of a change that must not change results print the same lines.
$(BUILD)/obj/tests/bitwise/fingerprint.o: CFLAGS += $(TOOLS_INC)
$(BUILD)/sk_fingerprint: $(BUILD)/obj/tests/bitwise/fingerprint.o $(BUILD)/libsparsek.a
	$(CC) -o $@ $^ $(CUDA_LIBS) $(LDLIBS)

run: $(BUILD)/sparsek
	$(BUILD)/sparsek run

# The Python tests need numpy and pytest: $(PYTHON)'s own when both import
# (no network needed), else a venv made once per build dir from PyPI.
PYTHON_HAS_TEST_DEPS = $(PYTHON) -c "import numpy, pytest" 2>/dev/null

$(BUILD)/venv/.ready:
	@echo "numpy or pytest missing in $(PYTHON): installing both from PyPI into $(BUILD)/venv"
	$(PYTHON) -m venv $(BUILD)/venv
	$(BUILD)/venv/bin/python -m pip install -q --disable-pip-version-check numpy pytest
	@touch $@

.PHONY: python-test-deps
python-test-deps:
	@$(PYTHON_HAS_TEST_DEPS) || $(MAKE) --no-print-directory -s $(BUILD)/venv/.ready

test-c: $(BUILD)/sk_tests
	$(BUILD)/sk_tests

test-asan: $(BUILD)/sk_tests_asan
	ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 $(BUILD)/sk_tests_asan

test-cli: $(BUILD)/sparsek $(BUILD)/test_cli_check
	sh tests/cli/test_cli.sh $(BUILD)/sparsek $(BUILD)/test_cli_check

test-python: lib python-test-deps
	@py=$$($(PYTHON_HAS_TEST_DEPS) && echo $(PYTHON) || echo $(BUILD)/venv/bin/python); \
	echo "python tests on $$py"; \
	SPARSEK_LIBRARY=$(CURDIR)/$(BUILD)/libsparsek.so PYTHONPATH=$(CURDIR)/python \
		$$py -m pytest -q python/tests

# Runs every suite even when one fails, then prints one closing line.
test: all $(BUILD)/sk_tests_asan python-test-deps
	@sh tests/run_all.sh $(MAKE)

gpu-test: $(BUILD)/sk_gpu_tests
	$(BUILD)/sk_gpu_tests $(GPU_TEST_ARGS)

# The GPU suite built with the Hopper kernels' mbarrier watchdog
# (src/cuda/common/hopper.cuh: a wait stuck for ~4 s prints the barrier and
# traps instead of hanging): build-watchdog/sk_gpu_tests. Run it on the GPU
# once per change to a Hopper kernel. The bounded waits cost registers (the
# D = 128 attention kernel spills a little), so spills are not errors there.
watchdog:
	$(MAKE) BUILD=build-watchdog NVCC_EXTRA=-DSK_MBAR_WATCHDOG NVCC_WERROR= build-watchdog/sk_gpu_tests

format:
	clang-format -i include/*.h src/*/*.c src/*/*.h src/cuda/*/*.h src/cuda/*/*.cu src/cuda/*/*.cuh \
		tools/*/*.c tools/*/*.h tests/*/*.c tests/*/*.h 2>/dev/null || true

clean:
	rm -rf $(BUILD)

# Install: $(DESTDIR)$(PREFIX)/{include,lib,bin}, plus lib/pkgconfig/sparsek.pc
# and lib/cmake/sparsek/ (find_package(sparsek)). Those two are written from
# packaging/*.in at install time: the prefix, the version in
# include/sparsek.h, and the static library's dependencies taken from the
# link flags above (CUDA_LIBS, LDLIBS), so they cannot drift from the build.
# libsparsek.so links cudart statically: a shared link needs no CUDA flags.
PREFIX ?= /usr/local
INSTALL ?= install
INSTALL_PREFIX = $(abspath $(PREFIX))
INSTALL_ROOT = $(DESTDIR)$(INSTALL_PREFIX)
INSTALL_CMAKE_DIR = $(INSTALL_ROOT)/lib/cmake/sparsek
# MAJOR.MINOR.PATCH of include/sparsek.h's SK_VERSION_* (defined in that order).
SK_VERSION_TEXT = $(shell sed -n 's/^.define SK_VERSION_[A-Z]*  *\([0-9][0-9]*\)$$/\1/p' \
	include/sparsek.h | paste -sd. -)
# packaging/<name>.in -> <destination>, its @NAMES@ filled in.
sk_configure = sed -e 's|@PREFIX@|$(INSTALL_PREFIX)|g' -e 's|@VERSION@|$(SK_VERSION_TEXT)|g' \
	-e 's|@LIBS_PRIVATE@|$(strip $(CUDA_LIBS) $(LDLIBS))|g' packaging/$(1).in > $(2)

.PHONY: install test-install
install: lib $(BUILD)/sparsek
	$(INSTALL) -d $(INSTALL_ROOT)/include $(INSTALL_ROOT)/bin $(INSTALL_ROOT)/lib/pkgconfig \
		$(INSTALL_CMAKE_DIR)
	$(INSTALL) -m 644 include/sparsek.h $(INSTALL_ROOT)/include/
	$(INSTALL) -m 644 $(BUILD)/libsparsek.so $(BUILD)/libsparsek.a $(INSTALL_ROOT)/lib/
	$(INSTALL) -m 755 $(BUILD)/sparsek $(INSTALL_ROOT)/bin/
	$(call sk_configure,sparsek.pc,$(INSTALL_ROOT)/lib/pkgconfig/sparsek.pc)
	$(call sk_configure,sparsekConfig.cmake,$(INSTALL_CMAKE_DIR)/sparsekConfig.cmake)
	$(call sk_configure,sparsekConfigVersion.cmake,$(INSTALL_CMAKE_DIR)/sparsekConfigVersion.cmake)

# Installs into build/test-install/ and builds a C program against it with
# pkg-config (shared and static) and CMake: tests/install/test_install.sh.
test-install: lib $(BUILD)/sparsek
	CC="$(CC)" sh tests/install/test_install.sh "$(MAKE)" $(BUILD)/test-install

# Fuzzing (tests/fuzz/, docs/reliability.md): libFuzzer harnesses built
# with clang, ASan + UBSan, over the CPU backend (the core and CPU sources,
# as in the sanitizer build). Each harness is tests/fuzz/<name>*.c plus the
# shared tests/fuzz/fz_*.c and *_case.c and the tests' naive references.
# `make fuzz` runs each for FUZZ_SECONDS (FUZZ_PARALLEL=1: all at once, one
# core each) into build/fuzz/work/, findings in build/fuzz/findings/;
# `make test` replays tests/fuzz/regressions/ and runs each harness for
# FUZZ_TEST_SECONDS on a scratch copy of its committed corpus.
# `make fuzz-seeds` rewrites the committed seeds (tests/fuzz/make_seeds.c).
FUZZ_CC ?= clang
FUZZ_SANITIZE ?= address,undefined
FUZZ_DIR ?= $(BUILD)/fuzz
FUZZ_SECONDS ?= 300
FUZZ_TEST_SECONDS ?= 30
FUZZ_PARALLEL ?= 0
FUZZ_HARNESSES := fuzz_layout fuzz_api
# Only the library gets libFuzzer's coverage instrumentation: the harnesses'
# own reference code would steer the fuzzer and slow it down.
# -Wno-pass-failed: clang's note that an `omp simd` loop was not vectorised.
FUZZ_CFLAGS := -std=c99 -D_POSIX_C_SOURCE=200809L $(WARN) -Wno-pass-failed -Iinclude -Isrc \
	-Itests -fopenmp -MMD -MP -O2 -g -fno-omit-frame-pointer -DSK_NO_CUDA \
	-fsanitize=$(FUZZ_SANITIZE) -fno-sanitize-recover=all
FUZZ_SHARED_SRC := $(sort $(wildcard tests/fuzz/fz_*.c tests/fuzz/*_case.c)) \
	tests/common/test_util.c tests/common/naive_ref.c tests/common/naive_bwd.c \
	tests/common/topk_naive.c tests/common/topk_check.c
FUZZ_SHARED_OBJ := $(patsubst %.c,$(FUZZ_DIR)/obj/%.o,$(CORE_SRC) $(FUZZ_SHARED_SRC))
FUZZ_BINS := $(addprefix $(FUZZ_DIR)/,$(FUZZ_HARNESSES))

$(FUZZ_DIR)/obj/%.o: %.c
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -c $< -o $@

$(FUZZ_DIR)/obj/src/%.o: src/%.c
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -fsanitize=fuzzer-no-link -c $< -o $@

# One link rule per harness: its own files, then everything shared.
define FUZZ_LINK
$(FUZZ_DIR)/$(1): $(patsubst %.c,$(FUZZ_DIR)/obj/%.o,$(wildcard tests/fuzz/$(1)*.c)) $(FUZZ_SHARED_OBJ)
	$(FUZZ_CC) -fsanitize=fuzzer,$(FUZZ_SANITIZE) -fopenmp -o $$@ $$^ -lm
endef
$(foreach h,$(FUZZ_HARNESSES),$(eval $(call FUZZ_LINK,$(h))))

# The seed writer: plain C, no sanitizer, no library.
$(FUZZ_DIR)/make_seeds: tests/fuzz/make_seeds.c tests/fuzz/fz_codec.c tests/fuzz/fz_layout_gen.c \
		$(wildcard tests/fuzz/*_case.c)
	@mkdir -p $(dir $@)
	$(CC) -std=c99 -D_POSIX_C_SOURCE=200809L $(WARN) -O1 -Iinclude -Itests -o $@ $^

.PHONY: fuzz fuzz-build fuzz-seeds test-fuzz
fuzz-build: $(FUZZ_BINS)

fuzz-seeds: $(FUZZ_DIR)/make_seeds
	@mkdir -p $(foreach h,$(FUZZ_HARNESSES),tests/fuzz/corpus/$(h) tests/fuzz/regressions/$(h))
	rm -f tests/fuzz/corpus/*/seed-* tests/fuzz/regressions/*/gen-*
	$(FUZZ_DIR)/make_seeds tests/fuzz

fuzz:
	@FUZZ_CC="$(FUZZ_CC)" FUZZ_DIR="$(FUZZ_DIR)" FUZZ_PARALLEL="$(FUZZ_PARALLEL)" \
		sh tests/fuzz/run_fuzz.sh fuzz "$(MAKE)" $(FUZZ_SECONDS) $(FUZZ_HARNESSES)

test-fuzz:
	@FUZZ_CC="$(FUZZ_CC)" FUZZ_DIR="$(FUZZ_DIR)" \
		sh tests/fuzz/run_fuzz.sh test "$(MAKE)" $(FUZZ_TEST_SECONDS) $(FUZZ_HARNESSES)


# --- Fuzzing the Python binding (tests/fuzz/python; atheris from PyPI) ---------
# `make fuzz-python` runs tests/fuzz/python/fuzz_binding.py for
# FUZZ_PYTHON_TIME seconds (or FUZZ_PYTHON_RUNS inputs) against a CPU-only
# library built with clang, ASan + UBSan and libFuzzer's coverage hooks,
# with atheris's ASan + libFuzzer runtime preloaded. It reads the committed
# seeds (tests/fuzz/python/corpus) and keeps what it finds in
# build/fuzz-python/ (corpus/, crash-* artifacts). atheris and numpy come
# from PyPI into build/fuzz-venv, made once.
FUZZ_CC ?= clang
FUZZ_PYTHON_TIME ?= 60
FUZZ_PYTHON_RUNS ?= -1
FUZZ_PY := $(BUILD)/fuzz-python

$(BUILD)/fuzz-venv/.ready:
	$(PYTHON) -m venv $(BUILD)/fuzz-venv
	$(BUILD)/fuzz-venv/bin/python -m pip install -q --disable-pip-version-check atheris numpy
	@touch $@

$(FUZZ_PY)/libsparsek.so: $(CORE_SRC) $(wildcard src/core/*.h src/cpu/*.h) include/sparsek.h
	@mkdir -p $(dir $@)
	$(FUZZ_CC) -shared -fPIC -O1 -g -std=c99 -D_POSIX_C_SOURCE=200809L -Iinclude -Isrc -DSK_NO_CUDA \
		-fopenmp -fsanitize=address,undefined,fuzzer-no-link -fno-sanitize-recover=all \
		-fno-omit-frame-pointer -Wno-pass-failed $(CORE_SRC) -o $@ -lm

.PHONY: fuzz-python
fuzz-python: $(FUZZ_PY)/libsparsek.so $(BUILD)/fuzz-venv/.ready
	@mkdir -p $(FUZZ_PY)/corpus
	cd tests/fuzz/python && \
	LD_PRELOAD=$$($(CURDIR)/$(BUILD)/fuzz-venv/bin/python -c "import atheris; print(atheris.path())")/asan_with_fuzzer.so \
	ASAN_OPTIONS=detect_leaks=0:allocator_may_return_null=1:quarantine_size_mb=64 OMP_NUM_THREADS=1 \
	SPARSEK_LIBRARY=$(CURDIR)/$(FUZZ_PY)/libsparsek.so PYTHONPATH=$(CURDIR)/python \
		$(CURDIR)/$(BUILD)/fuzz-venv/bin/python fuzz_binding.py -max_total_time=$(FUZZ_PYTHON_TIME) \
		-runs=$(FUZZ_PYTHON_RUNS) -rss_limit_mb=4096 -artifact_prefix=$(CURDIR)/$(FUZZ_PY)/ \
		$(CURDIR)/$(FUZZ_PY)/corpus corpus

# make test's share (the "fuzz-python" suite): FUZZ_PYTHON_TEST_SECONDS on
# the committed seeds, one verdict line that tests/run_all.sh counts.
FUZZ_PYTHON_TEST_SECONDS ?= 30
.PHONY: test-fuzz-python
test-fuzz-python:
	@mkdir -p $(BUILD)
	@if $(MAKE) --no-print-directory fuzz-python FUZZ_PYTHON_TIME=$(FUZZ_PYTHON_TEST_SECONDS) \
		> $(BUILD)/fuzz-python.log 2>&1; then \
		echo "PASS fuzz_binding: $$(grep -oE 'Done [0-9]+ runs in [0-9]+ second' $(BUILD)/fuzz-python.log)"; \
		echo "1 passed, 0 failed"; \
	else \
		tail -40 $(BUILD)/fuzz-python.log; \
		echo "FAIL fuzz_binding: see $(BUILD)/fuzz-python.log and $(FUZZ_PY)/crash-*"; \
		echo "0 passed, 1 failed"; \
	fi

-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)

# NCCL, for the context-parallel transport (src/core/comm_nccl.c): nccl.h
# from /usr/include, the CUDA toolkit, /usr/local/include or a pip
# nvidia-nccl wheel of $(PYTHON); libnccl.so.2 is opened at run time, so the
# library is never linked against it. Without CUDA or nccl.h,
# sk_comm_create_nccl answers SK_STATUS_NOT_SUPPORTED. NCCL_INC= disables.
ifeq ($(HAVE_CUDA),1)
NCCL_WHEEL_INC := $(shell $(PYTHON) -c "import nvidia.nccl as n; print(list(n.__path__)[0] + '/include')" 2>/dev/null)
NCCL_INC ?= $(firstword $(foreach d,/usr/include $(CUDA_HOME)/include /usr/local/include $(NCCL_WHEEL_INC),$(if $(wildcard $(d)/nccl.h),$(d))))
ifneq ($(strip $(NCCL_INC)),)
$(BUILD)/obj/core/comm_nccl.o: CFLAGS += -DSK_HAVE_NCCL -isystem $(NCCL_INC)
endif
endif

# SparseK build.
#
#   make            library (build/libsparsek.so, .a), CLI (build/sparsek), CPU tests
#   make run        build, then `sparsek run` on the default workload
#   make test       build, then every test that runs without a GPU: the CPU
#                   tests, the same under ASan+UBSan, the CLI tests and the
#                   Python tests (in a venv under build/)
#   make gpu-test   build and run the GPU test suite (needs a GPU)
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
NVCCFLAGS := -O3 -std=c++17 -Iinclude -Isrc -Xcompiler -fPIC,-fvisibility=hidden \
	--Werror all-warnings -Xptxas -v,--warn-on-spills -lineinfo

CORE_SRC := $(sort $(wildcard src/core/*.c) $(wildcard src/cpu/*.c))
CUDA_SRC := $(sort $(wildcard src/cuda/*/*.cu))
# Shared by the CPU and GPU test runners: harness, naive fp64 reference, helpers.
TEST_COMMON_SRC := tests/harness.c $(sort $(wildcard tests/common/*.c))
TEST_SRC := $(sort $(wildcard tests/cpu/*.c)) $(TEST_COMMON_SRC)
GPU_TEST_SRC := $(sort $(wildcard tests/gpu/*.c)) $(TEST_COMMON_SRC)

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

.PHONY: all lib run test test-c test-asan test-cli test-python gpu-test format clean
all: lib $(BUILD)/sparsek $(BUILD)/sk_tests

lib: $(BUILD)/libsparsek.so $(BUILD)/libsparsek.a

$(BUILD)/obj/%.o: src/%.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

$(BUILD)/obj/tests/%.o: tests/%.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Itests -c $< -o $@

$(BUILD)/obj/tools/%.o: tools/%.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

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
	$(CC) $(CFLAGS_ASAN) -Itests -c $< -o $@

$(BUILD)/libsparsek.so: $(LIB_OBJ)
	$(CC) -shared -o $@ $^ $(CUDA_LIBS) $(LDLIBS)

$(BUILD)/libsparsek.a: $(LIB_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/sparsek: $(BUILD)/obj/tools/sparsek.o $(BUILD)/libsparsek.a
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
	$(CC) $(CFLAGS) -c $< -o $@

$(BUILD)/gemm_speed: $(BUILD)/obj/bench/gemm_speed.o $(BUILD)/libsparsek.a
	$(CC) -o $@ $^ $(CUDA_LIBS) $(LDLIBS)

$(BUILD)/topk_speed: $(BUILD)/obj/bench/topk_speed.o $(BUILD)/libsparsek.a
	$(CC) -o $@ $^ $(CUDA_LIBS) $(LDLIBS)

run: $(BUILD)/sparsek
	$(BUILD)/sparsek run

# The venv holds the Python test dependencies; it is made once per build dir.
$(BUILD)/venv/.ready:
	$(PYTHON) -m venv $(BUILD)/venv
	$(BUILD)/venv/bin/python -m pip install -q --disable-pip-version-check numpy pytest
	@touch $@

test-c: $(BUILD)/sk_tests
	$(BUILD)/sk_tests

test-asan: $(BUILD)/sk_tests_asan
	ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 $(BUILD)/sk_tests_asan

test-cli: $(BUILD)/sparsek
	sh tests/cli/test_cli.sh $(BUILD)/sparsek

test-python: lib $(BUILD)/venv/.ready
	SPARSEK_LIBRARY=$(CURDIR)/$(BUILD)/libsparsek.so PYTHONPATH=$(CURDIR)/python \
		$(BUILD)/venv/bin/python -m pytest -q python/tests

# Runs every suite even when one fails, then prints one closing line.
test: all $(BUILD)/sk_tests_asan $(BUILD)/venv/.ready
	@sh tests/run_all.sh $(MAKE)

gpu-test: $(BUILD)/sk_gpu_tests
	$(BUILD)/sk_gpu_tests $(GPU_TEST_ARGS)

format:
	clang-format -i include/*.h src/*/*.c src/*/*.h src/cuda/*/*.h src/cuda/*/*.cu src/cuda/*/*.cuh \
		tools/*.c tests/*.c tests/*.h tests/*/*.c 2>/dev/null || true

clean:
	rm -rf $(BUILD)

-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)

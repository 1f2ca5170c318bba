# distsgd - build, test, demo and bench (GNU make).
#
#   make            build every example, test, bench and tool (build/...)
#   make test       install/check Debian packages, build the tests plain, with
#                   ASan+UBSan and (threaded ones) with TSan, compile-check the
#                   headers as C and C++, check the docs and the references,
#                   run everything (each test's distinct cases; a 16-seed
#                   soak; the MPI suite's quick tier), print the wall time
#                   and "N passed, N failed"
#   make test-full  what CI runs: make test with DSGD_TEST_FULL=1 (every
#                   sweep, seed and repetition; a 50-seed soak; the whole MPI
#                   suite), plus the whole header matrix, check-parts,
#                   compile-matrix and test-consumers
#   make soak [SOAK_SEEDS=1000]   tests/soak.c under TSan: that many random
#                   loopback training configurations (replicas, algorithms,
#                   NaN steps, failing replicas) against one_device
#   make demo       install/check packages, unpack Fashion-MNIST, run $(DEMO)
#                   (BLAS=openblas: its GEMM is OpenBLAS's, on OPENBLAS_NUM_THREADS, default 1)
#   make sync-vs-async   the same, then the sync-vs-async table at 4 workers
#   make sim        the same, then the simulated-cluster experiments (simnet):
#                   sync vs async, backup workers, linear scaling, the
#                   sweep of when sync beats async (experiments/crossover.c,
#                   minutes), the break-even bandwidth of
#                   gradient compression (experiments/breakeven.c), and every
#                   communication policy on a fast and a slow network
#                   (experiments/comm_policies.c); CSV, Chrome traces and
#                   (with gnuplot) PNGs in build/sim
#   make demo-mpi [MPI_DEMO_NP=2] [MPI_DEMO_LOCAL=1]   multi-worker training of
#                   the demo MLP under mpirun (tools/mpi.mk; installs OpenMPI)
#   make bench      build and run bench/*
#   make bench-breakeven-mpi   does gradient compression pay on this link?
#                   bench/breakeven_mpi.c at np 2 over TCP, the loopback as
#                   it is and throttled by tc, against simnet's break-even
#   make bench-peers   distsgd beside PyTorch (bench/peers.sh; installs PyTorch)
#   make bench-cnn   the CNN's step time, CPU vs OpenCL vs PyTorch, and the model
#                   interface's overhead (bench/cnn.sh; installs PyTorch)
#   make fuzz [FUZZ_SECONDS=N]   every libFuzzer target in fuzz/ for N seconds (clang)
#   make amalgamate / check-amalgamation   single_include/distsgd.h
#   make check-docs every DSGD_API declaration documented (tools/check_docs.py);
#                   the links and C blocks of README.md and docs/ (tools/check_docs_md.py)
#   make check-refs no tracker issue, ../shared or repository-file path in what
#                   users vendor; no package index's address anywhere
#   make check-parts every part of distsgd/ compiles with only the parts above
#                   it, as C99 and C++11 (tools/check_parts.py): no layer calls up;
#                   no part uses another part's private struct fields (clang);
#                   no part over 1,500 lines, no function over 100
#   make compile-matrix   C99/C11/C++11/C++17, DISTSGD_STATIC, two TUs, examples
#                         on the single include
#   make install / uninstall [PREFIX=/usr/local] [DESTDIR=]   headers + .pc
#   make test-consumers   pkg-config and CMake consumers of an install
#   make build-combos     a build with each optional dependency switched off
#                         (OpenCL: examples, tests, tools; OpenBLAS, both:
#                         the benches, its only users) and the MPI benches
#                         with mpicc,
#                         each in its own build/combo/ directory (CI runs it)
#   make clean
#
# Layout: examples/NAME.c -> build/examples/NAME and experiments/NAME.c ->
# build/experiments/NAME (programs a user would write: one translation unit
# with the implementation; built, like the benches, tools and fuzzers, with
# the implementation compiled once per variant and linked, see Programs
# below); bench/NAME.c -> build/bench/NAME, tools/NAME.c -> build/tools/NAME
# (developer programs). The tests, tests/test_PART.c, are
# compiled without the implementation and linked against the library built
# once per variant: build/lib/distsgd.o (and distsgd_cl.o) -> build/tests/,
# build/asan/lib -> build/asan/tests/, build/tsan/lib -> build/tsan/tests/
# (the ones marked "distsgd-test: tsan"); tests/soak.c -> build/tsan/soak
# (+ build/tests/soak, plain, the warning gate). Every binary depends on the
# headers, so editing a part rebuilds what uses it; tools and benches also
# depend on tools/*.h (tools/cl_gemm_measure.h is shared by both).

MAKEFLAGS += --no-builtin-rules
.SUFFIXES:
.DELETE_ON_ERROR:

CC ?= cc
CXX ?= c++
# Set with `=` (not `?=`) so a CFLAGS in the environment cannot drop the
# standard and warning flags; `make CFLAGS=...` still overrides.
CFLAGS = -std=c99 -Wall -Wextra -Wpedantic -Werror -O2 -g
CPPFLAGS += -I.
LDFLAGS ?=
LDLIBS = -lm -lpthread

# Sanitizer builds: the plain build is the warning gate, so these drop -Werror
# (sanitizers make gcc emit extra false-positive flow warnings) and use -O1.
# Line tables only (-g1): the reports name files and lines, and the library
# compiles in 30% less time than with -g.
SAN_CFLAGS = $(patsubst -g,-g1,$(filter-out -Werror -O%,$(CFLAGS))) -O1 -fno-omit-frame-pointer
# The plain tests' own sources (not the library they link, which keeps
# CFLAGS): -O1 instead of -O2 and -g1 instead of -g, half the compile time
# with the same warnings.
TEST_CFLAGS = $(patsubst -O2,-O1,$(patsubst -g,-g1,$(CFLAGS)))
ASAN_FLAGS = -fsanitize=address,undefined -fno-sanitize-recover=all
TSAN_FLAGS = -fsanitize=thread
# TSan compiler: $(CC) when it can link a TSan program, else clang. Evaluated
# once, and only when a TSan binary is built.
TSAN_CC = $(eval TSAN_CC := $(shell printf 'int main(void){return 0;}\n' | \
    $(CC) -fsanitize=thread -x c - -o /dev/null >/dev/null 2>&1 && echo '$(CC)' || echo clang))$(TSAN_CC)

# Bench: fast code for this machine only.
BENCH_CFLAGS = $(CFLAGS) -O3 -march=native

# Header compile check: every top-level header as C (both compilers, C99 and
# C11) and as C++11 (both compilers), implementation included, warnings fatal.
# At -O0 (the language and each compiler's own warnings; 3x faster), except
# g++ at -O2: gcc's optimiser-dependent warnings are gated for C by the -O2
# library objects of make test and by make all, for C++ here.
CHECK_CC ?= gcc clang
CHECK_CXX ?= g++ clang++
CHECK_WARN = -Wall -Wextra -Wpedantic -Werror
check_opt = $(if $(filter g++,$(1)),-O2,-O0)

# Demo: one place to switch the main example.
DEMO ?= mirrored_mlp
FMNIST_SRC ?= /usr/share/datasets/fashion-mnist
FMNIST_DIR = build/data/fashion-mnist
DEMO_ARGS ?= --data $(FMNIST_DIR)
# Extra flags passed to the demo program: make demo ARGS="..."
ARGS ?=
# The examples' GEMM: BLAS=builtin (default), distsgd's own; BLAS=openblas,
# cblas_sgemm through DSGD_USE_CBLAS (OpenBLAS found as for bench/ below;
# make demo installs it), with the examples built into build/openblas/. The
# built-in GEMM is the default: here it is as fast as OpenBLAS's AVX-512
# kernels and 1.8x Debian 12's OpenBLAS as it runs by default on this CPU
# (README, Benchmarks), and its results do not depend on the thread count.
BLAS ?= builtin
# Where binaries go (make build-combos builds into others).
BUILD ?= $(if $(filter openblas,$(BLAS)),build/openblas,build)

# ---------------------------------------------------------------- sources

# The maps (distsgd.h, distsgd_cl.h, ...) and the parts they include.
MAP_HEADERS := $(wildcard *.h)
HEADERS := $(MAP_HEADERS) $(wildcard distsgd/*.h distsgd/cl/*.h)
EXAMPLE_SRCS := $(wildcard examples/*.c)
EXPERIMENT_SRCS := $(wildcard experiments/*.c)
TEST_SRCS := $(wildcard tests/test_*.c)
BENCH_SRCS := $(wildcard bench/*.c)
TOOL_SRCS := $(wildcard tools/*.c)
FUZZ_SRCS := $(wildcard fuzz/fuzz_*.c)
ALL_SRCS := $(EXAMPLE_SRCS) $(EXPERIMENT_SRCS) $(TEST_SRCS) $(BENCH_SRCS) $(TOOL_SRCS) $(FUZZ_SRCS)

# OpenCL sources: a name with a "cl", "opencl" or "clblast" word (test_cl.c,
# test_cl_gemm.c, mirrored_cl.c; not test_clip.c), or a source that includes
# distsgd_cl.h, <CL/...> or clblast. Built with pkg-config's OpenCL and CLBlast
# flags; skipped (with a note) where pkg-config cannot find them.
cl_by_name = $(foreach f,$(1),$(if $(filter cl opencl clblast,$(subst _, ,$(basename $(notdir $f)))),$f))
CL_SRCS := $(sort $(call cl_by_name,$(ALL_SRCS)) \
    $(if $(ALL_SRCS),$(shell grep -lE '^[[:space:]]*#[[:space:]]*include[[:space:]]*[<"]([^">]*/)?(distsgd_cl\.h|CL/|clblast)' $(ALL_SRCS) 2>/dev/null)))
CL_OK := $(shell pkg-config --exists OpenCL clblast 2>/dev/null && echo yes)
ifeq ($(CL_OK),yes)
CL_CFLAGS := $(shell pkg-config --cflags OpenCL clblast)
CL_LIBS := $(shell pkg-config --libs OpenCL clblast)
CL_SKIPPED :=
else
CL_SKIPPED := $(CL_SRCS)
endif
is_cl = $(filter $(1),$(CL_SRCS))
cl_cflags = $(if $(call is_cl,$(1)),$(CL_CFLAGS))
cl_libs = $(if $(call is_cl,$(1)),$(CL_LIBS))

# OpenBLAS for bench/: pkg-config, else a cblas.h beside a libopenblas the
# compiler can find.
OPENBLAS_PC := $(shell pkg-config --exists openblas 2>/dev/null && echo yes)
ifeq ($(OPENBLAS_PC),yes)
OPENBLAS_CFLAGS := -DDSGD_HAVE_OPENBLAS $(shell pkg-config --cflags openblas)
OPENBLAS_LIBS := $(shell pkg-config --libs openblas)
else
OPENBLAS_HDR := $(firstword $(wildcard /usr/include/x86_64-linux-gnu/openblas*/cblas.h /usr/include/openblas/cblas.h /usr/include/cblas.h))
OPENBLAS_LIB := $(filter /%,$(shell $(CC) -print-file-name=libopenblas.so 2>/dev/null))
ifneq ($(and $(OPENBLAS_HDR),$(OPENBLAS_LIB)),)
OPENBLAS_CFLAGS := -DDSGD_HAVE_OPENBLAS -I$(patsubst %/,%,$(dir $(OPENBLAS_HDR)))
OPENBLAS_LIBS := -lopenblas
endif
endif

ifeq ($(BLAS),openblas)
EXAMPLE_BLAS_CFLAGS = -DDSGD_USE_CBLAS $(filter-out -DDSGD_HAVE_OPENBLAS,$(OPENBLAS_CFLAGS))
EXAMPLE_BLAS_LIBS = $(OPENBLAS_LIBS)
endif
# Checked when an example is built, so that `make demo BLAS=openblas` can
# install OpenBLAS first.
blas_check = $(if $(filter builtin openblas,$(BLAS)),,$(error BLAS=$(BLAS): use BLAS=builtin or BLAS=openblas))$(if \
    $(filter openblas,$(BLAS)),$(if $(OPENBLAS_CFLAGS),,$(error BLAS=openblas: OpenBLAS not found by pkg-config or \
    beside the compiler (sh tools/deps.sh bench installs libopenblas-dev))))

# Markers in a test's first comment (tests/harness.h): "distsgd-test: tsan"
# (threaded: also built and run under TSan), "distsgd-test:
# own-implementation" (compiles the library itself; no library object is
# linked into it).
test_marked = $(if $(strip $(2)),$(shell grep -l 'distsgd-test: $(1)' $(2) 2>/dev/null))
TSAN_TEST_SRCS := $(call test_marked,tsan,$(TEST_SRCS))
OWN_IMPL_SRCS := $(call test_marked,own-implementation,$(TEST_SRCS))

BUILD_EXAMPLE_SRCS := $(filter-out $(CL_SKIPPED),$(EXAMPLE_SRCS))
BUILD_TEST_SRCS := $(filter-out $(CL_SKIPPED),$(TEST_SRCS))
BUILD_BENCH_SRCS := $(filter-out $(CL_SKIPPED),$(BENCH_SRCS))
BUILD_TOOL_SRCS := $(filter-out $(CL_SKIPPED),$(TOOL_SRCS))
BUILD_TSAN_SRCS := $(filter-out $(CL_SKIPPED),$(TSAN_TEST_SRCS))

EXAMPLES := $(patsubst examples/%.c,$(BUILD)/examples/%,$(BUILD_EXAMPLE_SRCS))
EXPERIMENTS := $(patsubst experiments/%.c,$(BUILD)/experiments/%,$(filter-out $(CL_SKIPPED),$(EXPERIMENT_SRCS)))
TESTS := $(patsubst tests/%.c,$(BUILD)/tests/%,$(BUILD_TEST_SRCS))
ASAN_TESTS := $(patsubst tests/%.c,$(BUILD)/asan/tests/%,$(BUILD_TEST_SRCS))
TSAN_TESTS := $(patsubst tests/%.c,$(BUILD)/tsan/tests/%,$(BUILD_TSAN_SRCS))
# The soak (tests/soak.c, not a cmocka test): random loopback training
# configurations under TSan, one seed each. make soak runs SOAK_SEEDS of them;
# make test runs its default, 16 seeds (50 under make test-full), through
# tools/run_tests.sh, which counts each seed as a test.
SOAK := $(BUILD)/tsan/soak
SOAK_PLAIN := $(BUILD)/tests/soak
SOAK_SEEDS ?= 1000
SOAK_FIRST ?= 1
BENCHES := $(patsubst bench/%.c,$(BUILD)/bench/%,$(BUILD_BENCH_SRCS))
TOOLS := $(patsubst tools/%.c,$(BUILD)/tools/%,$(BUILD_TOOL_SRCS))

# distsgd_mpi.h is checked by tools/mpi.mk, with MPI's include flags.
CHECK_HEADERS := $(filter-out $(if $(CL_OK),,%_cl.h) %_mpi.h,$(MAP_HEADERS))
HEADER_CHECKS := $(foreach h,$(CHECK_HEADERS),\
    $(foreach c,$(CHECK_CC),$(foreach s,c99 c11,$(BUILD)/check/$(basename $h).$c.$s.ok)) \
    $(foreach c,$(CHECK_CXX),$(BUILD)/check/$(basename $h).$c.c++11.ok))
# make test's share: each header (its name without .h: $(1)) as C99 with
# the first C compiler and C++11 with the last C++ one (gcc, clang++), -O0.
quick_checks = $(BUILD)/check/$(1).$(firstword $(CHECK_CC)).c99.ok $(BUILD)/check/$(1).$(lastword $(CHECK_CXX)).c++11.ok
HEADER_CHECKS_QUICK := $(foreach h,$(CHECK_HEADERS),$(call quick_checks,$(basename $h)))

# Environment of test and bench runs.
TEST_ENV = POCL_CACHE_DIR=$(CURDIR)/build/pocl-cache POCL_MAX_PTHREAD_COUNT=2 \
    OPENBLAS_NUM_THREADS=1 ASAN_OPTIONS=detect_leaks=1$${ASAN_OPTIONS:+:$$ASAN_OPTIONS} \
    TSAN_OPTIONS=halt_on_error=1$${TSAN_OPTIONS:+:$$TSAN_OPTIONS} $(if $(TEST_FULL),DSGD_TEST_FULL=1)
BENCH_ENV = POCL_CACHE_DIR=$${POCL_CACHE_DIR:-$(CURDIR)/build/pocl-cache} \
    POCL_MAX_PTHREAD_COUNT=$${POCL_MAX_PTHREAD_COUNT:-2} \
    OPENBLAS_NUM_THREADS=$${OPENBLAS_NUM_THREADS:-1}

# ---------------------------------------------------------------- targets

.PHONY: build-combos tune bench-mpi bench-overlap-mpi bench-breakeven-mpi bench-peers bench-cnn fuzz soak all examples tests bench-build tools test test-full test-prep test-bins test-build test-run check-header check-docs check-refs check-parts check-parts-sizes \
    demo demo-run sync-vs-async sync-vs-async-run sim sim-run bench bench-run clean cl-note

all: examples tests bench-build tools

examples: $(EXAMPLES) $(EXPERIMENTS) cl-note
tests: $(TESTS) $(SOAK_PLAIN) cl-note
bench-build: $(BENCHES) cl-note
tools: $(TOOLS) $(if $(CL_OK),$(BUILD)/tools/cl_calls.so) cl-note

cl-note:
	$(if $(CL_SKIPPED),@echo "note: OpenCL or CLBlast not found by pkg-config; skipping $(CL_SKIPPED) (tools/deps.sh test installs them)")

# The package check runs before a second make reads this file again, so that
# pkg-config sees what deps.sh installed.
# make test runs as many jobs as there are CPUs unless -j says otherwise.
NPROC := $(shell nproc 2>/dev/null || echo 2)
# Two phases. First (test-prep, as many jobs as CPUs unless -j says
# otherwise) whatever keeps a CPU busy: every test binary, the checks (the
# compilers of the header and docs checks) and the plain OpenCL runs, which
# on a fresh clone spend a minute compiling PoCL's kernels into its cache.
# Then (test-run) the test runs alone, the longest first, one job more than
# CPUs (TEST_RUN_JOBS): a test waiting on a deadline leaves its CPU to
# another. The phases keep the compilers away from the tests whose threads
# hand off often: beside a compiler those ran 5-15x slower than alone.
TEST_J = $(if $(findstring -j,$(MAKEFLAGS)),,-j$(NPROC))
TEST_RUN_JOBS ?= $(shell echo $$(($(NPROC) + 1)))
test:
	sh tools/deps.sh test
	@$(MAKE) --no-print-directory $(TEST_J) test-prep
	@$(MAKE) --no-print-directory -j$(TEST_RUN_JOBS) test-run TEST_PREPARED=1 TEST_START=$(shell date +%s)

# make test-full: the same binaries with DSGD_TEST_FULL=1 (every point of
# the tests' sweeps, their repetitions and full samples: tests/harness.h's
# tu_full), and every check make test leaves out: the header check's whole
# matrix, the compile matrix, check-parts' compiles, the packaging
# consumers, the whole MPI suite (OpenMPI and MPICH) and the SMPI
# comparison. .ci/run runs it.
# (TEST_FULL=1 on make's command line reaches test's sub-makes too.)
test-full:
	@$(MAKE) --no-print-directory test TEST_FULL=1

# The TSan binaries first: their runs are the longest.
test-bins: $(TSAN_TESTS) $(SOAK) $(ASAN_TESTS) $(TESTS) cl-note
test-build: test-bins check-header

check-header: $(if $(TEST_FULL),$(HEADER_CHECKS),$(HEADER_CHECKS_QUICK))

# Every DSGD_API declaration has a comment that gives its thread safety and,
# when it returns dsgd_result, its errors (tools/check_docs.py); README.md's
# and docs/'s links resolve and their C blocks compile (the README's program
# also as C++20, and runs), unless marked as fragments (tools/check_docs_md.py).
check-docs:
	$(PYTHON) tools/check_docs.py $(HEADERS)
	$(PYTHON) tools/check_docs_md.py README.md $(wildcard docs/*.md)

# The files a user vendors or reads (distsgd/, the maps, single_include/,
# README.md, docs/) name no tracker issue, no path outside the repository
# and no test, bench, example or tool file; no package index's address
# anywhere (tools/check_refs.sh).
check-refs:
	bash tools/check_refs.sh

# Every part compiles with only the parts above it in its map (no layer calls
# up), as C99 and as C++11; and no part uses a field of another part's
# private struct (clang's AST; skipped without clang); no part over 1,500
# lines and no function in one over 100.
check-parts:
	$(PYTHON) tools/check_parts.py $(CC) $(CXX)

# make test's share of check-parts: the sizes alone (no compiler).
check-parts-sizes:
	$(PYTHON) tools/check_parts.py --sizes

# The amalgamation, documentation and compile-matrix checks and the packaging
# consumers run in test-prep, so that the last line of make test is the test
# binaries' summary.
# Each test binary runs as a target of its own, $(BUILD)/run/PATH.res (its
# counts; PATH.res.out its output), so make -j runs them side by side; the
# scripts (the MPI suite, the SMPI comparison) run last, alone. test-run
# then prints every output in order and the summary.
CHECKS := test-build check-amalgamation check-docs check-refs \
    $(if $(TEST_FULL),check-parts compile-matrix test-consumers,check-parts-sizes)
RUN_BINS = $(TSAN_TESTS) $(ASAN_TESTS) $(TESTS) $(SOAK)
run_res = $(patsubst $(BUILD)/%,$(BUILD)/run/%.res,$(1))
RUN_RESULTS = $(call run_res,$(RUN_BINS))
SCRIPT_RESULTS = $(patsubst tests/%,$(BUILD)/run/scripts/%.res,$(MPI_TEST_RUNS) $(SIM_TEST_RUNS))
.PHONY: FORCE
FORCE:

$(BUILD)/run/scripts/%.res: tests/% $(RUN_RESULTS) $(if $(TEST_PREPARED),,$(CHECKS)) FORCE
	@mkdir -p $(@D) build/pocl-cache
	@$(TEST_ENV) bash tools/run_tests.sh --one $< $@

$(BUILD)/run/%.res: $(BUILD)/% FORCE
	$(run_one)
define run_one
@mkdir -p $(@D) build/pocl-cache
@echo "run   $< (at $$(date +%T))"
@$(TEST_ENV) bash tools/run_tests.sh --one $< $@
endef

# The plain OpenCL runs: in test-prep, each time; test-run after test-prep
# (TEST_PREPARED=1) takes their results unless their binary changed since.
CL_PLAIN_RESULTS = $(call run_res,$(filter $(addprefix %/,$(basename $(notdir $(CL_SRCS)))),$(TESTS)))
$(CL_PLAIN_RESULTS): $(BUILD)/run/%.res: $(BUILD)/% $(if $(TEST_PREPARED),,FORCE)
	$(run_one)
# The OpenCL runs first: each starts as soon as its binary is linked, and its
# kernels compile beside the other builds.
test-prep: $(CL_PLAIN_RESULTS) test-bins $(CHECKS)

# make starts prerequisites in the order given: the longest first (the TSan
# runs; the simnet and collectives tests, whose threads hand off often),
# then the rest. Without TEST_PREPARED (make test-run alone) the checks run
# here too.
FIRST_RUNS = $(call run_res,$(TSAN_TESTS) $(filter %/test_simnet %/test_collectives,$(TESTS) $(ASAN_TESTS)))
test-run: $(FIRST_RUNS) $(RUN_RESULTS) $(if $(TEST_PREPARED),,$(CHECKS))
	@$(if $(strip $(TESTS) $(ASAN_TESTS) $(TSAN_TESTS)),,echo "no tests found in tests/test_*.c" >&2; exit 1)
	@$(TEST_ENV) $(if $(TEST_START),TEST_START=$(TEST_START)) bash tools/run_tests.sh --report \
	    $(RUN_RESULTS) $(SCRIPT_RESULTS)

# The soak: SOAK_SEEDS seeds from SOAK_FIRST, each a random configuration
# trained in a child process under TSan with a 30 s watchdog; a failing seed
# is printed with its configuration (rerun it with build/tsan/soak --seed K);
# the last line is "N passed, N failed".
soak: $(SOAK)
	$(TEST_ENV) $(SOAK) --seeds $(SOAK_SEEDS) --first $(SOAK_FIRST)

demo:
	$(blas_check)sh tools/deps.sh demo
	$(if $(filter openblas,$(BLAS)),sh tools/deps.sh bench)
	@$(MAKE) --no-print-directory demo-run

FMNIST_FILES := train-images-idx3-ubyte train-labels-idx1-ubyte t10k-images-idx3-ubyte t10k-labels-idx1-ubyte

demo-run: $(BUILD)/examples/$(DEMO) $(addprefix $(FMNIST_DIR)/,$(FMNIST_FILES))
	$(if $(filter openblas,$(BLAS)),OPENBLAS_NUM_THREADS=$${OPENBLAS_NUM_THREADS:-1}) $(BUILD)/examples/$(DEMO) $(DEMO_ARGS) $(ARGS)

# The sync-vs-async table (examples/sync_vs_async.c): mirrored and the
# parameter servers' policies at 4 workers; ARGS="--straggler 4" slows one.
sync-vs-async:
	sh tools/deps.sh demo
	@$(MAKE) --no-print-directory sync-vs-async-run

sync-vs-async-run: $(BUILD)/examples/sync_vs_async $(addprefix $(FMNIST_DIR)/,$(FMNIST_FILES))
	$(BUILD)/examples/sync_vs_async $(DEMO_ARGS) $(ARGS)

# The simulated-cluster experiments (experiments/, on sim_common.h): each
# writes CSV and Chrome traces to build/sim, and a PNG when gnuplot is
# installed (tools/deps.sh demo installs gnuplot-nox). About 6.5 CPU
# minutes (comm_policies 3, crossover 2, linear_scaling 1, breakeven 0.5),
# two runs at a time where a program has several (--jobs), so roughly 4
# minutes of wall time on 2 idle cores (11 before the runs stopped once
# their result was known).
SIM_EXAMPLES := $(addprefix $(BUILD)/experiments/,sync_vs_async_sim backup_workers linear_scaling crossover breakeven comm_policies)
sim:
	sh tools/deps.sh demo
	@$(MAKE) --no-print-directory sim-run

sim-run: $(SIM_EXAMPLES) $(addprefix $(FMNIST_DIR)/,$(FMNIST_FILES))
	$(BUILD)/experiments/sync_vs_async_sim --out build/sim
	$(BUILD)/experiments/backup_workers --out build/sim
	$(BUILD)/experiments/linear_scaling --out build/sim --data $(FMNIST_DIR)
	$(BUILD)/experiments/crossover --out build/sim
	$(BUILD)/experiments/breakeven --out build/sim
	$(BUILD)/experiments/comm_policies --out build/sim --data $(FMNIST_DIR)

# make test-full: simnet's all-reduce times against SimGrid's SMPI
# (tests/simnet_smpi.sh); it reports itself skipped where smpicc is missing
# (Debian libsimgrid-dev and simgrid, not installed by tools/deps.sh).
SIM_TEST_RUNS := $(if $(TEST_FULL),tests/simnet_smpi.sh)
# test_simnet runs the experiments' helper (test_outputs).
$(BUILD)/tests/test_simnet $(BUILD)/asan/tests/test_simnet $(BUILD)/tsan/tests/test_simnet: experiments/sim_common.h

$(FMNIST_DIR)/%: $(FMNIST_SRC)/%.gz
	@mkdir -p $(@D)
	gzip -dc $< > $@.tmp
	@mv $@.tmp $@

bench: bench-build
	$(if $(OPENBLAS_CFLAGS),,@echo "note: OpenBLAS not found: benches run without the cblas_sgemm comparison (tools/deps.sh bench installs libopenblas-dev)")
	@mkdir -p build/pocl-cache
	@$(if $(BENCHES),,echo "no benchmarks found in bench/*.c")
	@set -e; $(foreach b,$(BENCHES),echo "==== $b"; $(BENCH_ENV) $b;)

# distsgd beside PyTorch on the demo's task (bench/peers.sh): N = 1, 2, 4,
# both MLPs, interleaved rounds; installs PyTorch into build/peers-venv from
# PyPI (says so and runs distsgd alone when it cannot). ROUNDS=, EPOCHS= and
# the others in the script's header are passed through the environment.
bench-peers:
	sh tools/deps.sh demo
	bash bench/peers.sh

# The CNN of examples/cnn_fashion_mnist.c, one step at batch 64 (bench/cnn.sh):
# distsgd's CPU and OpenCL backends beside PyTorch on 1 and nproc threads
# (installed as for bench-peers), and the model interface's overhead at N = 1.
bench-cnn:
	bash bench/cnn.sh

# libFuzzer targets (fuzz/fuzz_NAME.c, clang's -fsanitize=fuzzer with ASan
# and UBSan): each runs FUZZ_SECONDS on its seeds (fuzz/corpus/NAME, read
# only) and what it finds worth keeping (build/fuzz/corpus/NAME), with
# fuzz/NAME.dict when there is one. A crash, a sanitizer report, a leak or a
# result a target does not allow stops it and fails the target; libFuzzer
# writes the input to build/fuzz/. CI runs FUZZ_SECONDS=5.
FUZZ_CC ?= clang
FUZZ_SECONDS ?= 60
FUZZ_FLAGS = -std=c99 -Wall -Wextra -Wpedantic -Werror -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all
BUILD_FUZZ_SRCS := $(filter-out $(CL_SKIPPED),$(FUZZ_SRCS))
FUZZERS := $(patsubst fuzz/%.c,build/fuzz/%,$(BUILD_FUZZ_SRCS))

fuzz: $(FUZZERS) cl-note
	bash tools/fuzz.sh $(FUZZ_SECONDS) $(FUZZERS)

# (Built by the program rules below: the implementation compiled once, in
# build/fuzzlib/, with the fuzzer's instrumentation but not its main.)

# Tunes CLBlast's GEMM for the chosen OpenCL device (DSGD_CL_DEVICE) and
# writes the per-device cache the backend applies at start-up; make tune
# ARGS="--time 240" passes flags (see tools/cl_tune.c).
tune: $(BUILD)/tools/cl_tune
	@mkdir -p build/pocl-cache
	$(BENCH_ENV) $(BUILD)/tools/cl_tune $(ARGS)

# MPI_Allreduce beside distsgd's all-reduces over its MPI transport (the
# native hook, ring, direct through shared-memory windows), in one run, at
# the sizes of bench/allreduce, then the loopback's for comparison
# (OpenMPI: tools/deps.sh mpi installs libopenmpi-dev and openmpi-bin). Root
# needs --allow-run-as-root; more ranks than cores need --oversubscribe.
MPICC ?= mpicc
MPIRUN ?= mpirun --allow-run-as-root --oversubscribe
MPI_NP ?= 2 4
bench-mpi: $(BUILD)/bench/allreduce
	@sh tools/deps.sh mpi
	@mkdir -p $(BUILD)/mpi
	$(MPICC) -std=c99 -O3 -march=native -I. bench/allreduce_mpi.c -o $(BUILD)/mpi/allreduce_mpi -lm -lpthread
	@set -e; for n in $(MPI_NP); do echo "==== MPI_Allreduce and distsgd over MPI, $$n processes"; \
	    $(MPIRUN) -np $$n $(BUILD)/mpi/allreduce_mpi $(ARGS); done
	@echo "==== distsgd loopback all-reduce"
	$(BENCH_ENV) $(BUILD)/bench/allreduce -n $(shell echo $(MPI_NP) | tr ' ' ,) $(ARGS)

# A training step over MPI with the gradient exchange after backward and
# beside it (dsgd_strategy_desc.overlap), in one run: the CNN at np 4 and 2,
# TCP between the ranks over the loopback throttled by tc to LINKS per rank
# (default 1gbit; "none": as it is), as between machines
# (bench/overlap_mpi.sh: root, removes its qdisc on exit; ARGS go to the
# bench, e.g. ARGS="--mlp" for the MLP; REPEATS, NPS as the script says).
bench-overlap-mpi:
	@sh tools/deps.sh mpi
	@mkdir -p $(BUILD)/mpi
	$(MPICC) -std=c99 -O3 -march=native -I. bench/overlap_mpi.c -o $(BUILD)/mpi/overlap_mpi -lm -lpthread
	BUILD=$(BUILD) MPIRUN="$(MPIRUN)" ARGS="$(ARGS)" sh bench/overlap_mpi.sh

# Does gradient compression pay on this link? bench/breakeven_mpi.c at np 2
# over TCP, the loopback as it is and throttled by tc (bench/breakeven_mpi.sh:
# root, removes its qdisc on exit; ARGS go to the bench), against simnet's
# break-even (experiments/breakeven.h).
bench-breakeven-mpi:
	@sh tools/deps.sh mpi
	@mkdir -p $(BUILD)/mpi
	$(MPICC) -std=c99 -O3 -march=native -I. bench/breakeven_mpi.c -o $(BUILD)/mpi/breakeven_mpi -lm -lpthread
	BUILD=$(BUILD) MPIRUN="$(MPIRUN)" ARGS="$(ARGS)" sh bench/breakeven_mpi.sh

# The optional dependencies switched off in turn, each build from scratch in
# its own directory, so code that compiles only when OpenBLAS, OpenCL or MPI
# is present fails here. A variable given on the command line overrides the
# detection above: OPENBLAS_CFLAGS= OPENBLAS_LIBS= drops OpenBLAS, CL_OK=
# drops OpenCL (its sources are skipped, as on a machine without it). MPI:
# bench/allreduce_mpi.c is built without it by `all`, and here with $(MPICC)
# when that is installed (tools/deps.sh mpi installs OpenMPI). The combos
# compile at -O0 without -g (5x faster here; `make all` is the -O2 build
# whose optimiser-dependent warnings count): they check what each
# configuration compiles, with every warning an error. Only what a switch
# changes is rebuilt: without OpenCL, the examples, tests and tools (its
# sources drop out; the benches without it are the third combo's);
# without OpenBLAS, the benches, its only users (examples use it only with
# BLAS=openblas, which needs it), alone and without OpenCL too.
NO_BLAS = OPENBLAS_CFLAGS= OPENBLAS_LIBS=
NO_CL = CL_OK=
COMBO_FLAGS = CFLAGS="$(filter-out -O% -g,$(CFLAGS)) -O0" BENCH_CFLAGS='$$(CFLAGS)'
build-combos:
	$(MAKE) --no-print-directory BUILD=build/combo/no-openblas $(NO_BLAS) $(COMBO_FLAGS) bench-build
	$(MAKE) --no-print-directory BUILD=build/combo/no-opencl $(NO_CL) $(COMBO_FLAGS) examples tests tools
	$(MAKE) --no-print-directory BUILD=build/combo/no-openblas-no-opencl $(NO_BLAS) $(NO_CL) $(COMBO_FLAGS) bench-build
	@if command -v $(firstword $(MPICC)) >/dev/null 2>&1; then \
	    mkdir -p build/combo/mpi && \
	    echo "$(MPICC) $(CFLAGS) bench/allreduce_mpi.c -o build/combo/mpi/allreduce_mpi" && \
	    $(MPICC) $(CPPFLAGS) $(CFLAGS) bench/allreduce_mpi.c -o build/combo/mpi/allreduce_mpi $(LDLIBS) && \
	    echo "$(MPICC) $(CFLAGS) bench/overlap_mpi.c -o build/combo/mpi/overlap_mpi" && \
	    $(MPICC) $(CPPFLAGS) $(CFLAGS) bench/overlap_mpi.c -o build/combo/mpi/overlap_mpi $(LDLIBS) && \
	    echo "$(MPICC) $(CFLAGS) bench/breakeven_mpi.c -o build/combo/mpi/breakeven_mpi" && \
	    $(MPICC) $(CPPFLAGS) $(CFLAGS) bench/breakeven_mpi.c -o build/combo/mpi/breakeven_mpi $(LDLIBS); \
	else \
	    echo "build-combos: $(firstword $(MPICC)) not found, MPI build skipped (tools/deps.sh mpi installs OpenMPI)"; \
	fi

clean:
	rm -rf build

# ---------------------------------------------------------------- rules

# One compile rule per kind of program: $(call program,COMPILER,FLAGS,LIBS)
# builds $@ from its first prerequisite (a .c file) and the library objects
# among its prerequisites, with OpenCL's flags when the source is an OpenCL
# one.
program = @mkdir -p $(@D)$(newline)$(1) $(CPPFLAGS) $(2) $(call cl_cflags,$<) $< $(filter %.o,$^) -o $@ $(LDFLAGS) \
    $(3) $(call cl_libs,$<) $(LDLIBS)
define newline


endef
comma := ,
hash := \#

# An LD_PRELOAD library that counts a program's blocking OpenCL calls and
# launches (tools/preload/cl_calls.c; GNU C, not part of the checks).
$(BUILD)/tools/cl_calls.so: tools/preload/cl_calls.c
	@mkdir -p $(@D)
	$(CC) -O2 -Wall -Wextra -Werror -shared -fPIC $(CL_CFLAGS) $< -o $@ -ldl

# The library, compiled once per build variant: the core's implementation
# (distsgd.o) and the OpenCL add-on's (distsgd_cl.o) in objects of their own,
# which every test of that variant links, as a user's second file does.
# The programs (examples, experiments, tools: build/lib; benches:
# build/benchlib, at the benches' -O3 -march=native with OpenBLAS) link the
# same way, each variant's objects compiled once.
LIB_VARIANTS := lib asan/lib tsan/lib benchlib
lib_flags = $(if $(findstring tsan/,$(1)),$(SAN_CFLAGS) $(TSAN_FLAGS),$(if $(findstring asan/,$(1)),$(SAN_CFLAGS) $(ASAN_FLAGS),$(if \
    $(findstring benchlib/,$(1)),$(BENCH_CFLAGS) $(OPENBLAS_CFLAGS),$(CFLAGS) $(EXAMPLE_BLAS_CFLAGS))))
lib_cc = $(if $(findstring tsan/,$(1)),$(TSAN_CC),$(CC))
impl_defs = $(if $(findstring _cl,$(1)),-DDISTSGD_CL_IMPLEMENTATION $(CL_CFLAGS),-DDISTSGD_IMPLEMENTATION)
define lib_rules
$(BUILD)/$(1)/%.o: %.h $(HEADERS)
	@mkdir -p $$(@D)
	$$(call lib_cc,$$@) $(CPPFLAGS) $$(call lib_flags,$$@) $$(call impl_defs,$$*) -x c -c $$< -o $$@
endef
$(foreach v,$(LIB_VARIANTS),$(eval $(call lib_rules,$v)))
LIB_OBJS := $(foreach v,$(LIB_VARIANTS),$(BUILD)/$v/distsgd.o $(if $(CL_OK),$(BUILD)/$v/distsgd_cl.o))
.SECONDARY: $(LIB_OBJS)

# The objects test source $(1) links in the variant whose objects are in $(2).
test_objs = $(if $(filter $(1),$(OWN_IMPL_SRCS)),,$(2)/distsgd.o $(if $(call is_cl,$(1)),$(2)/distsgd_cl.o))
TEST_DEPS := $(HEADERS) $(wildcard tests/*.h)

.SECONDEXPANSION:
$(BUILD)/tests/%: tests/%.c $(TEST_DEPS) $$(call test_objs,tests/$$*.c,$(BUILD)/lib)
	$(call program,$(CC),$(TEST_CFLAGS),-lcmocka)

$(BUILD)/asan/tests/%: tests/%.c $(TEST_DEPS) $$(call test_objs,tests/$$*.c,$(BUILD)/asan/lib)
	$(call program,$(CC),$(SAN_CFLAGS) $(ASAN_FLAGS),$(ASAN_FLAGS) -lcmocka)

$(BUILD)/tsan/tests/%: tests/%.c $(TEST_DEPS) $$(call test_objs,tests/$$*.c,$(BUILD)/tsan/lib)
	$(call program,$(TSAN_CC),$(SAN_CFLAGS) $(TSAN_FLAGS),$(TSAN_FLAGS) -lcmocka)

# Programs: examples/NAME.c and experiments/NAME.c (written as a user would,
# one translation unit with the implementation), bench/NAME.c, tools/NAME.c
# and fuzz/fuzz_NAME.c. Each is compiled without its #defines of the
# implementation macros ($(BUILD)/gen/: blank lines in their place, a #line
# naming the source, so messages point into it) and linked with its
# variant's library objects, so the implementation is compiled once per
# variant, not once per program. A program that calls the library's private
# functions (dsgd__, dsgd_cl__), includes distsgd_mpi.h or says "distsgd-program:
# own-implementation" (it reads a private struct) compiles as it is, with
# the implementation inside.
own_impl = $(if $(shell grep -lE 'dsgd_(cl_)?_|distsgd_mpi\.h|distsgd-program: own-implementation' $(1) 2>/dev/null),yes)
prog_objs = $(if $(call own_impl,$(1)),,$(2)/distsgd.o $(if $(call is_cl,$(1)),$(2)/distsgd_cl.o))
# $(call linked_program,COMPILER,FLAGS,LIBS): as program, from the source
# with the implementation macros blanked, unless it keeps its own.
linked_program = @mkdir -p $(@D) $(BUILD)/gen/$(dir $<)$(newline)$(if $(call own_impl,$<),$(call program,$(1),$(2),$(3)),@{ \
    printf '$(hash)line 1 "%s"\n' $<; sed -E 's/^$(hash)define DISTSGD_(CL_)?IMPLEMENTATION([[:space:]].*)?$$//' $<; } >$(BUILD)/gen/$<$(newline)$(1) \
    $(CPPFLAGS) $(2) -I$(dir $<) $(call cl_cflags,$<) $(BUILD)/gen/$< $(filter %.o,$^) -o $@ $(LDFLAGS) $(3) \
    $(call cl_libs,$<) $(LDLIBS))

$(BUILD)/examples/%: examples/%.c $(HEADERS) $(wildcard examples/*.h) $$(call prog_objs,examples/$$*.c,$(BUILD)/lib)
	$(blas_check)$(call linked_program,$(CC),$(CFLAGS) $(EXAMPLE_BLAS_CFLAGS),$(EXAMPLE_BLAS_LIBS))

$(BUILD)/experiments/%: experiments/%.c $(HEADERS) $(wildcard experiments/*.h examples/*.h) \
    $$(call prog_objs,experiments/$$*.c,$(BUILD)/lib)
	$(blas_check)$(call linked_program,$(CC),$(CFLAGS) $(EXAMPLE_BLAS_CFLAGS),$(EXAMPLE_BLAS_LIBS))

$(BUILD)/bench/%: bench/%.c $(HEADERS) $(wildcard bench/*.h) $(wildcard tools/*.h) $(wildcard experiments/*.h) \
    $$(call prog_objs,bench/$$*.c,$(BUILD)/benchlib)
	$(call linked_program,$(CC),$(BENCH_CFLAGS) $(OPENBLAS_CFLAGS),$(OPENBLAS_LIBS))

$(BUILD)/tools/%: tools/%.c $(HEADERS) $(wildcard tools/*.h) $$(call prog_objs,tools/$$*.c,$(BUILD)/lib)
	$(call linked_program,$(CC),$(CFLAGS))

build/fuzz/%: fuzz/%.c $(HEADERS) fuzz/fuzz_util.h $$(call prog_objs,fuzz/$$*.c,build/fuzzlib)
	$(call linked_program,$(FUZZ_CC),$(FUZZ_FLAGS),)

build/fuzzlib/%.o: %.h $(HEADERS)
	@mkdir -p $(@D)
	$(FUZZ_CC) $(CPPFLAGS) $(subst fuzzer$(comma),fuzzer-no-link$(comma),$(FUZZ_FLAGS)) $(call impl_defs,$*) -x c -c $< -o $@
.SECONDARY: build/fuzzlib/distsgd.o build/fuzzlib/distsgd_cl.o

$(SOAK): tests/soak.c $(HEADERS) $(BUILD)/tsan/lib/distsgd.o
	$(call program,$(TSAN_CC),$(SAN_CFLAGS) $(TSAN_FLAGS),$(TSAN_FLAGS))

$(SOAK_PLAIN): tests/soak.c $(HEADERS) $(BUILD)/lib/distsgd.o
	$(call program,$(CC),$(CFLAGS))

# Header checks: $(BUILD)/check/HEADER.COMPILER.STD.ok
hc_defs = -DDISTSGD_IMPLEMENTATION $(if $(findstring _cl,$(1)),-DDISTSGD_CL_IMPLEMENTATION $(CL_CFLAGS))

define header_check_rules
$(BUILD)/check/$(basename $(1)).$(2).c99.ok: $(HEADERS)
	@mkdir -p $$(@D)
	$(2) -std=c99 $(CHECK_WARN) $(call check_opt,$(2)) $(CPPFLAGS) $(call hc_defs,$(1)) -x c -c $(1) -o /dev/null
	@touch $$@
$(BUILD)/check/$(basename $(1)).$(2).c11.ok: $(HEADERS)
	@mkdir -p $$(@D)
	$(2) -std=c11 $(CHECK_WARN) $(call check_opt,$(2)) $(CPPFLAGS) $(call hc_defs,$(1)) -x c -c $(1) -o /dev/null
	@touch $$@
endef
define header_check_cxx_rule
$(BUILD)/check/$(basename $(1)).$(2).c++11.ok: $(HEADERS)
	@mkdir -p $$(@D)
	$(2) -std=c++11 $(CHECK_WARN) $(call check_opt,$(2)) $(CPPFLAGS) $(call hc_defs,$(1)) -x c++ -c $(1) -o /dev/null
	@touch $$@
endef
$(foreach h,$(CHECK_HEADERS),$(foreach c,$(CHECK_CC),$(eval $(call header_check_rules,$h,$c))))
$(foreach h,$(CHECK_HEADERS),$(foreach c,$(CHECK_CXX),$(eval $(call header_check_cxx_rule,$h,$c))))

# ---------------------------------------------------------------- shipping

# After `all` so that neither fragment provides the default target.
include tools/amalgamation.mk
include tools/install.mk
include tools/mpi.mk

# After the fragments: the scripts' list is complete only here (tools/mpi.mk).
test-run: $(SCRIPT_RESULTS)

# A sanitizer's run of an OpenCL test follows the plain run of the same test:
# that one fills PoCL's kernel cache (build/pocl-cache), so the sanitizer
# builds never compile kernels (PoCL's compiler leaks, which LeakSanitizer
# would report against the test).
$(foreach t,$(filter $(CL_SRCS),$(BUILD_TEST_SRCS)),$(foreach v,asan tsan,$(eval \
    $(BUILD)/run/$v/tests/$(basename $(notdir $t)).res: $(BUILD)/run/tests/$(basename $(notdir $t)).res)))

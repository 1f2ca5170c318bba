# The MPI add-on (distsgd_mpi.h, distsgd/mpi/): its tests and header checks.
# Included from the Makefile (after its rules):  include tools/mpi.mk
#
#   make test-mpi     install/check OpenMPI (tools/deps.sh mpi), build
#                     tests/mpi_collectives.c with $(MPICC) into $(BUILD)/mpi/
#                     (also as mpi_collectives_pieces, with
#                     DSGD_MPI_MAX_MESSAGE=4096 so that messages and native
#                     all-reduces go in many MPI messages, and
#                     DSGD_MPI_SHARE_BYTES=4096 so that DIRECT goes through
#                     the shared-memory windows in many pieces), and run
#                     tests/mpi_collectives.sh: the suite at np = 2 3 4
#                     (MPI_TEST_NP overrides) under $(MPIRUN) with a timeout
#                     each, the thread-level checks, several endpoints per
#                     process (--local K at the np:K of 2:2 3:2 2:3;
#                     MPI_TEST_LOCAL overrides), the deadline check (the job
#                     must end non-zero within 5 s of dsgd_mpi_abort), the
#                     pieces build at np = 3 (also --local 2); when
#                     $(MPICH_CC) is installed (tools/deps.sh mpi installs
#                     MPICH beside OpenMPI, which stays the default mpicc),
#                     builds with it as mpi_collectives_mpich and
#                     mpi_workers_mpich, run at np = 2 (the suite, --local 2,
#                     and multi-worker training) under $(MPICH_RUN);
#                     each run's checks, then "N passed, N failed" counting runs;
#                     and tests/mpi_workers.c (multi-worker mirrored across
#                     processes against an in-process loopback run),
#                     tests/mpi_elastic.c (a leave 3 -> 2, a grow 2 -> 3 by
#                     spawn, a crash relaunched by tools/elastic_launch.sh), and
#                     examples/multi_worker_mlp.c --verify at np 2 when
#                     Fashion-MNIST is installed: the script's full tier
#                     (TEST_FULL=1, which it passes on as DSGD_TEST_FULL=1)
#   make test         runs the same script among the test binaries (a test per
#                     run in the summary) when $(MPICC) is found, else says it
#                     skipped the MPI tests: its quick tier (each program and
#                     feature once, the suite at np = 2 3, --local at 2:2, no
#                     MPICH, no multi_worker_mlp; the script's header lists
#                     the runs), and builds only what that runs; make
#                     test-full (TEST_FULL=1) the full tier, as make test-mpi
#   make demo-mpi     examples/multi_worker_mlp.c under mpirun (see below)
#   make demo-ps-mpi  examples/ps_mpi.c under mpirun: parameter servers
#                     across processes (see below); tests/mpi_ps.c and
#                     tests/mpi_strategy_ps.c (the parameter-server
#                     strategy) run in the script above at np = 4
#   make check-header also compiles distsgd_mpi.h with the implementation as
#                     C99 and C11 ($(CHECK_CC)) and C++11 ($(CHECK_CXX)),
#                     warnings fatal, with MPI's include flags, when <mpi.h>
#                     is found with them (the Makefile leaves *_mpi.h to this
#                     file)
#
# MPICC and MPIRUN are the Makefile's (make bench-mpi uses them too). MPI's
# include flags come from the wrapper (OpenMPI: mpicc --showme:compile) or
# pkg-config (mpi, mpich). Without MPI, as `make MPI_FOUND= MPI_H_FOUND=` shows,
# both are skipped with a note.

MPI_PARTS := $(wildcard distsgd/mpi/*.h)
# The parts join the headers everything below depends on, and the ones
# make check-docs reads (its recipe expands HEADERS when it runs).
HEADERS += $(MPI_PARTS)

MPI_FOUND := $(shell command -v $(firstword $(MPICC)) >/dev/null 2>&1 && echo yes)
MPI_CFLAGS := $(shell $(MPICC) --showme:compile 2>/dev/null || pkg-config --cflags mpi 2>/dev/null || \
    pkg-config --cflags mpich 2>/dev/null)
MPI_H_FOUND := $(shell printf '\043include <mpi.h>\n' | $(CC) $(MPI_CFLAGS) -E -x c - >/dev/null 2>&1 && echo yes)

MPI_BUILD = $(BUILD)/mpi
MPI_TEST_BINS = $(MPI_BUILD)/mpi_collectives $(MPI_BUILD)/mpi_collectives_pieces $(MPI_BUILD)/mpi_workers \
    $(MPI_BUILD)/mpi_ps $(MPI_BUILD)/mpi_strategy_ps $(MPI_BUILD)/ps_mpi $(MPI_BUILD)/mpi_elastic
# multi_worker_mlp --verify (bitwise equal to the one-process run) when
# Fashion-MNIST is installed (tools/deps.sh test installs it); the full
# tier alone runs it, so make test builds neither it nor the data
MPI_FMNIST := $(if $(wildcard $(FMNIST_SRC)/train-images-idx3-ubyte.gz),$(addprefix $(FMNIST_DIR)/,$(FMNIST_FILES)))
MPI_TEST_BINS += $(if $(TEST_FULL),$(if $(MPI_FMNIST),$(MPI_BUILD)/multi_worker_mlp $(MPI_FMNIST)))
# the suite's np and np:K lists; empty: the script's own for its tier
# (tests/mpi_collectives.sh: np = 2 3 4 and 2:2 3:2 2:3 in the full tier,
# np = 2 3 and 2:2 in the quick one)
MPI_TEST_NP ?=
MPI_TEST_LOCAL ?=
MPI_TEST_ENV = DSGD_MPI_BUILD=$(MPI_BUILD) DSGD_MPIRUN="$(MPIRUN)" DSGD_MPI_NP="$(MPI_TEST_NP)" \
    DSGD_MPI_LOCAL="$(MPI_TEST_LOCAL)" DSGD_MPICH_RUN="$(MPICH_RUN)"

# MPICH beside OpenMPI (Debian's mpich package names its wrappers *.mpich):
# optional, used when present, by the full tier alone (MPICH busy-polls), so
# make test does not compile it.
MPICH_CC ?= mpicc.mpich
MPICH_RUN ?= mpirun.mpich
MPICH_FOUND := $(shell command -v $(firstword $(MPICH_CC)) >/dev/null 2>&1 && echo yes)
ifeq ($(MPICH_FOUND),yes)
MPI_TEST_BINS += $(if $(TEST_FULL),$(MPI_BUILD)/mpi_collectives_mpich $(MPI_BUILD)/mpi_workers_mpich)
endif

.PHONY: test-mpi test-mpi-run mpi-note mpi-header-note

# The package check first, then a second make that finds what it installed;
# make test-mpi runs the full tier, make test-mpi-run the tier of TEST_FULL.
test-mpi:
	sh tools/deps.sh mpi
	@$(MAKE) --no-print-directory test-mpi-run TEST_FULL=1

test-mpi-run: $(MPI_TEST_BINS)
	$(MPI_TEST_ENV) $(if $(TEST_FULL),DSGD_TEST_FULL=1) bash tests/mpi_collectives.sh

# The MPI tests are compiled without the implementation and linked against
# the core's object of the plain variant ($(BUILD)/lib/distsgd.o) and the
# MPI add-on's, compiled once per MPI: distsgd_mpi.o (OpenMPI's mpicc),
# distsgd_mpi_pieces.o (4 KiB messages and shared-memory pieces),
# distsgd_mpi_mpich.o (MPICH). The examples are programs a user would write
# and compile the implementation themselves.
MPI_PIECES_DEFS = -DDSGD_MPI_MAX_MESSAGE=4096 -DDSGD_MPI_SHARE_BYTES=4096
mpi_lib_cc = $(if $(findstring _mpich,$(1)),$(MPICH_CC),$(MPICC))
mpi_lib_defs = -DDISTSGD_MPI_IMPLEMENTATION $(if $(findstring _pieces,$(1)),$(MPI_PIECES_DEFS))
$(MPI_BUILD)/lib/%.o: distsgd_mpi.h $(HEADERS)
	@mkdir -p $(@D)
	$(call mpi_lib_cc,$*) $(CPPFLAGS) $(CFLAGS) $(call mpi_lib_defs,$*) -x c -c $< -o $@
.SECONDARY: $(addprefix $(MPI_BUILD)/lib/,distsgd_mpi.o distsgd_mpi_pieces.o distsgd_mpi_mpich.o)

# $(call mpi_program,COMPILER[,DEFINES]): the Makefile's program rule with an
# MPI compiler (a configuration macro such as DSGD_MPI_SHARE_BYTES is given
# to every file, as the library asks).
mpi_program = $(call program,$(1),$(CFLAGS) $(2))
MPI_CORE = $(BUILD)/lib/distsgd.o

$(MPI_BUILD)/mpi_collectives: tests/mpi_collectives.c tests/coll_ref.h $(HEADERS) $(MPI_CORE) $(MPI_BUILD)/lib/distsgd_mpi.o
	$(call mpi_program,$(MPICC))
$(MPI_BUILD)/mpi_collectives_pieces: tests/mpi_collectives.c tests/coll_ref.h $(HEADERS) $(MPI_CORE) $(MPI_BUILD)/lib/distsgd_mpi_pieces.o
	$(call mpi_program,$(MPICC),$(MPI_PIECES_DEFS))
$(MPI_BUILD)/mpi_collectives_mpich: tests/mpi_collectives.c tests/coll_ref.h $(HEADERS) $(MPI_CORE) $(MPI_BUILD)/lib/distsgd_mpi_mpich.o
	$(call mpi_program,$(MPICH_CC))
$(MPI_BUILD)/mpi_workers: tests/mpi_workers.c $(HEADERS) $(MPI_CORE) $(MPI_BUILD)/lib/distsgd_mpi.o
	$(call mpi_program,$(MPICC))
$(MPI_BUILD)/mpi_workers_mpich: tests/mpi_workers.c $(HEADERS) $(MPI_CORE) $(MPI_BUILD)/lib/distsgd_mpi_mpich.o
	$(call mpi_program,$(MPICH_CC))
$(MPI_BUILD)/mpi_ps: tests/mpi_ps.c $(HEADERS) $(MPI_CORE) $(MPI_BUILD)/lib/distsgd_mpi.o
	$(call mpi_program,$(MPICC))
$(MPI_BUILD)/mpi_strategy_ps: tests/mpi_strategy_ps.c $(HEADERS) $(MPI_CORE) $(MPI_BUILD)/lib/distsgd_mpi.o
	$(call mpi_program,$(MPICC))
$(MPI_BUILD)/mpi_elastic: tests/mpi_elastic.c $(HEADERS) $(MPI_CORE) $(MPI_BUILD)/lib/distsgd_mpi.o
	$(call mpi_program,$(MPICC))

# make test: tools/run_tests.sh runs MPI_TEST_RUNS (the Makefile's
# $(BUILD)/run/scripts/ rule, after every other test) with TEST_ENV, which
# carries the settings above.
ifeq ($(MPI_FOUND),yes)
MPI_TEST_RUNS := tests/mpi_collectives.sh
TEST_ENV += $(MPI_TEST_ENV)
test-run test-bins: $(MPI_TEST_BINS)
$(BUILD)/run/scripts/mpi_collectives.sh.res: $(MPI_TEST_BINS)
else
MPI_TEST_RUNS :=
test-run: mpi-note
endif

mpi-note:
	@echo "note: $(firstword $(MPICC)) not found: the MPI tests (make test-mpi) are skipped (tools/deps.sh mpi installs OpenMPI)"

mpi-header-note:
	@echo "note: <mpi.h> not found (with $(MPICC)'s or pkg-config's flags): distsgd_mpi.h is not compile-checked (tools/deps.sh mpi installs OpenMPI)"

# Header checks: $(BUILD)/check/distsgd_mpi.COMPILER.STD.ok, as the
# Makefile's for the other maps, plus MPI's include flags.
ifeq ($(MPI_H_FOUND),yes)
MPI_HEADER_CHECKS := $(foreach c,$(CHECK_CC),$(foreach s,c99 c11,$(BUILD)/check/distsgd_mpi.$c.$s.ok)) \
    $(foreach c,$(CHECK_CXX),$(BUILD)/check/distsgd_mpi.$c.c++11.ok)
check-header: $(if $(TEST_FULL),$(MPI_HEADER_CHECKS),$(call quick_checks,distsgd_mpi))
else
check-header: mpi-header-note
endif

mpi_check_cc = $(word 1,$(subst ., ,$(1)))
mpi_check_std = $(word 2,$(subst ., ,$(1)))
$(BUILD)/check/distsgd_mpi.%.ok: distsgd_mpi.h $(HEADERS)
	@mkdir -p $(@D)
	$(call mpi_check_cc,$*) -std=$(call mpi_check_std,$*) $(CHECK_WARN) $(call check_opt,$(call mpi_check_cc,$*)) \
	    $(CPPFLAGS) $(MPI_CFLAGS) \
	    -DDISTSGD_IMPLEMENTATION -DDISTSGD_MPI_IMPLEMENTATION \
	    -x $(if $(findstring ++,$(call mpi_check_std,$*)),c++,c) -c distsgd_mpi.h -o /dev/null
	@touch $@

# make demo-mpi [MPI_DEMO_NP=2] [MPI_DEMO_LOCAL=1] [ARGS=...]: the demo
# dataset and OpenMPI as `make demo` and `make test-mpi` install them, then
# examples/multi_worker_mlp.c built with $(MPICC) and run under $(MPIRUN) at
# MPI_DEMO_NP processes with MPI_DEMO_LOCAL replicas each (multi-worker
# mirrored; `make demo-mpi MPI_DEMO_NP=4` for four workers).
MPI_DEMO_NP ?= 2
MPI_DEMO_LOCAL ?= 1
.PHONY: demo-mpi demo-mpi-run

demo-mpi:
	sh tools/deps.sh demo
	sh tools/deps.sh mpi
	@$(MAKE) --no-print-directory demo-mpi-run

demo-mpi-run: $(MPI_BUILD)/multi_worker_mlp $(addprefix $(FMNIST_DIR)/,$(FMNIST_FILES))
	timeout 900 $(MPIRUN) -np $(MPI_DEMO_NP) $(MPI_BUILD)/multi_worker_mlp --local $(MPI_DEMO_LOCAL) $(DEMO_ARGS) $(ARGS)

$(MPI_BUILD)/%: examples/%.c $(HEADERS) $(wildcard examples/*.h)
	$(call mpi_program,$(MPICC))

# make demo-ps-mpi [ARGS=...]: examples/ps_mpi.c built with $(MPICC) and run
# under $(MPIRUN) at np = 4, 2 parameter servers + 2 workers (the rank
# layout), ASYNC; ARGS="--policy sync|ssp|backup" and the example's other
# flags. tests/mpi_collectives.sh also runs this binary with a bad
# TF_CONFIG (every process must fail), so make test-mpi builds it too.
.PHONY: demo-ps-mpi demo-ps-mpi-run

demo-ps-mpi:
	sh tools/deps.sh demo
	sh tools/deps.sh mpi
	@$(MAKE) --no-print-directory demo-ps-mpi-run

demo-ps-mpi-run: $(MPI_BUILD)/ps_mpi $(addprefix $(FMNIST_DIR)/,$(FMNIST_FILES))
	timeout 600 $(MPIRUN) -np 4 $(MPI_BUILD)/ps_mpi --servers 2 $(DEMO_ARGS) $(ARGS)


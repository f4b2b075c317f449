# idalloc build. `make help` lists the targets; README.md explains them.
#
# Sources are found by convention, so a module never edits this file:
#   base/ src/common/ src/pool/ raft/ fsm/ storage/ src/node/ src/client/
#       *.c (except *_main.c) go into $(BUILD)/libida.a
#   src/node/idallocd_main.c  -> bin/idallocd
#   src/client/idalloc_main.c -> bin/idalloc
#   src/client/*.c + base + common -> lib/libidalloc.a/.so
#   tests/DIR/test_*.c  -> $(BUILD)/tests/DIR/test_*  Criterion binaries (make test)
#   tests/DIR/bench_*.c -> $(BUILD)/bench/bench_*     benchmarks (make bench)
#   tests/DIR/*_main.c  -> $(BUILD)/prog/*            helper programs (sim, chaos)
#   tests/DIR/other .c  -> support code linked into every binary of DIR
#   tests/lib/*.c       -> $(BUILD)/libidatest.a, shared test code linked into
#                          every test, benchmark and helper program
# mk/*.mk fragments may add targets and append to CHAOS_EXTRA / TEST_EXTRA.

.DEFAULT_GOAL := all
SHELL := /bin/bash
.SUFFIXES:
.DELETE_ON_ERROR:
.SECONDARY:

BUILD ?= build
DEBUG ?= 0
SAN ?=
CC ?= cc
PROTOC_C ?= protoc-c

# Outputs users run: bin/ and lib/ for the default build, inside $(BUILD)
# for sanitizer builds so they never overwrite each other.
ifeq ($(BUILD),build)
BINDIR := bin
LIBDIR := lib
else
BINDIR := $(BUILD)/bin
LIBDIR := $(BUILD)/lib
endif

ifeq ($(DEBUG),1)
OPT := -O0 -g3
else
OPT := -O2 -g
endif

CPPFLAGS := -D_POSIX_C_SOURCE=200809L -I. -Iinclude -I$(BUILD)/gen -MMD -MP
WARN := -Wall -Wextra -Werror -Wshadow -Wstrict-prototypes -Wmissing-prototypes
CFLAGS := -std=c11 $(OPT) $(WARN) -pthread -fPIC $(EXTRA_CFLAGS)
LDFLAGS := -pthread $(EXTRA_LDFLAGS)
LDLIBS := -luv -lprotobuf-c -llmdb -lssl -lcrypto -lm -lmicrohttpd
# jansson: the CLI's --json, and the tests that parse it.
CLI_LDLIBS := -ljansson
ifneq ($(SAN),)
CFLAGS += -fsanitize=$(SAN) -fno-omit-frame-pointer -fno-sanitize-recover=all
LDFLAGS += -fsanitize=$(SAN)
endif

# --- sources ---------------------------------------------------------------
PROTO_C := $(BUILD)/gen/proto/idalloc.pb-c.c
PROTO_H := $(BUILD)/gen/proto/idalloc.pb-c.h
PROTO_O := $(BUILD)/obj/gen/proto/idalloc.pb-c.o

BASE_SRC := $(wildcard base/*.c)
COMMON_SRC := $(BASE_SRC) $(wildcard src/common/*.c)
LIB_SRC := $(filter-out %_main.c,$(COMMON_SRC) $(wildcard src/pool/*.c) \
    $(wildcard raft/*.c) $(wildcard fsm/*.c) $(wildcard storage/*.c) \
    $(wildcard src/node/*.c) $(wildcard src/client/*.c))
# The CLI's own code (parsing, --json, bench) goes into bin/idalloc, not
# into libidalloc: the library does not link jansson.
CLI_SRC := $(wildcard src/client/cli.c src/client/cli_*.c src/client/bench.c)
CLIENT_SRC := $(filter-out %_main.c $(CLI_SRC),$(COMMON_SRC) $(wildcard src/client/*.c))

obj = $(patsubst %.c,$(BUILD)/obj/%.o,$(1))
PERCENT := %
LIBIDA := $(BUILD)/libida.a

TESTLIB_SRC := $(wildcard tests/lib/*.c)
TESTLIB := $(BUILD)/libidatest.a
TEST_SRC := $(wildcard tests/*/test_*.c)
BENCH_SRC := $(wildcard tests/*/bench_*.c)
PROG_SRC := $(wildcard tests/*/*_main.c)
TEST_BINS := $(patsubst tests/%.c,$(BUILD)/tests/%,$(TEST_SRC))
BENCH_BINS := $(addprefix $(BUILD)/bench/,$(notdir $(BENCH_SRC:.c=)))
PROG_BINS := $(addprefix $(BUILD)/prog/,$(patsubst %_main.c,%,$(notdir $(PROG_SRC))))
# Support objects of a tests/ directory (argument: "tests/DIR/").
support_of = $(call obj,$(filter-out $(1)test_%.c $(1)bench_%.c $(1)%_main.c,$(wildcard $(1)*.c)))

PROGRAMS :=
ifneq ($(wildcard src/node/idallocd_main.c),)
PROGRAMS += $(BINDIR)/idallocd
endif
ifneq ($(wildcard src/client/idalloc_main.c),)
PROGRAMS += $(BINDIR)/idalloc $(LIBDIR)/libidalloc.a $(LIBDIR)/libidalloc.so
endif

ALL_OBJ := $(call obj,$(LIB_SRC) $(TEST_SRC) $(BENCH_SRC) $(PROG_SRC) $(TESTLIB_SRC) \
    $(filter-out $(TEST_SRC) $(BENCH_SRC) $(PROG_SRC),$(wildcard tests/*/*.c)) \
    $(wildcard src/*/*_main.c)) $(PROTO_O)

# Module fragments: extra targets, and additions to TEST_EXTRA / CHAOS_EXTRA
# (included here, before the targets that read those variables).
TEST_EXTRA :=
CHAOS_EXTRA :=
-include mk/*.mk

# --- public targets ---------------------------------------------------------
.PHONY: all build deps programs build-programs test asan tsan tsan-fsm valgrind sim chaos bench bench-etcd run node \
    format format-check check-layers clean help test-run

all: deps
	@$(MAKE) --no-print-directory build

deps:
	@scripts/deps.sh

build: $(LIBIDA) $(PROGRAMS) $(TEST_BINS) $(BENCH_BINS) $(PROG_BINS)

# Only what users run: bin/idallocd, bin/idalloc and lib/libidalloc.{a,so}.
programs: deps
	@$(MAKE) --no-print-directory build-programs

build-programs: $(PROGRAMS)
	@:

test: deps
	@$(MAKE) --no-print-directory build
	@$(MAKE) --no-print-directory test-run

test-run: $(TEST_EXTRA)
	@IDA_BUILD=$(BUILD) IDA_BINDIR=$(BINDIR) scripts/run-tests.sh $(TEST_BINS)

asan:
	@ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
	 LSAN_OPTIONS=suppressions=$(CURDIR)/scripts/lsan.supp \
	 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	 $(MAKE) --no-print-directory test BUILD=build/asan SAN=address,undefined DEBUG=1

# ThreadSanitizer on the pool's tests (src/pool, tests/pool) and the client
# library's (its I/O thread, tests/client/test_client.c and test_async.c).
# Criterion cannot start a test binary whose .bss is large under TSan
# ("Could not initialize inheritable arena", Snaipe/Criterion#274), which
# rules out the fsm's tests (and tests/node/test_snap_stream.c): a restore
# shared with a lent thread is checked by running the fsm benchmark's
# two-thread restores, its snapshot decoded by a thread as it is fed
# (src/node/snap_stream.h) and its replay under TSan (make tsan-fsm, a few
# minutes).
TSAN_TESTS = $(patsubst tests/%.c,build/tsan/tests/%,$(wildcard tests/pool/test_*.c) \
    $(wildcard tests/client/test_client.c tests/client/test_async.c))
tsan: deps
	@if [ -z "$(TSAN_TESTS)" ]; then \
	  echo "make tsan: no pool tests yet (tests/pool/test_*.c)" >&2; exit 1; fi
	@$(MAKE) --no-print-directory BUILD=build/tsan SAN=thread $(TSAN_TESTS)
	@TSAN_OPTIONS=halt_on_error=1 IDA_BUILD=build/tsan scripts/run-tests.sh $(TSAN_TESTS)

# make tsan-fsm: bench_fsm at 200,000 allocations under ThreadSanitizer; its
# restores with a lent thread share each phase of a bounded pool's load, its
# snapshot is decoded by a stream's thread while it is fed, and its replay
# has the lent thread decoding the next block of entries.
tsan-fsm: deps
	@$(MAKE) --no-print-directory BUILD=build/tsan SAN=thread build/tsan/bench/bench_fsm
	@TSAN_OPTIONS=halt_on_error=1 build/tsan/bench/bench_fsm 200000

# valgrind on the unit tests (Criterion forks, hence --trace-children;
# the system's programs a test runs, make, sed or cc, are not traced):
# every test directory but the simulator's, the cluster's and chaos (real
# processes, timing). Half an hour or more; VALGRIND_DIRS picks some
# (make valgrind VALGRIND_DIRS="fsm pool").
# Each process writes its own log ($(BUILD)/valgrind/TEST.PID.log) and the
# run fails if any log is not empty: a test's body runs in a process
# Criterion forks, and that process's exit code 99 (valgrind's on an
# error) comes after Criterion counted the test as passed, so the
# runner's exit code says nothing of it. A test that fails without a
# memory error is named and fails the run too, unless VALGRIND_TIMING_OK=1
# (under valgrind's 20-50x slowdown a deadline of a few hundred ms can be
# missed).
VALGRIND_DIRS ?= unit fsm raft storage pool client node
VALGRIND_LOGS = $(BUILD)/valgrind
valgrind: all
	@rm -rf $(VALGRIND_LOGS); mkdir -p $(VALGRIND_LOGS); \
	  n=0; slow=""; bad=""; for d in $(VALGRIND_DIRS); do \
	  for t in $(BUILD)/tests/$$d/test_*; do \
	    [ -x "$$t" ] || continue; n=$$((n + 1)); name=$$(basename $$t); \
	    echo "valgrind $$t"; \
	    valgrind -q --trace-children=yes \
	      --trace-children-skip='/usr/bin/*,/usr/local/bin/*,/usr/lib/gcc/*,/usr/libexec/*' \
	      --error-exitcode=99 --leak-check=full --show-leak-kinds=definite \
	      --errors-for-leak-kinds=definite \
	      --log-file=$(VALGRIND_LOGS)/$$name.%p.log $$t --jobs 1 >/dev/null; rc=$$?; \
	    if find $(VALGRIND_LOGS) -name "$$name.*.log" -size +0 | grep -q .; then \
	      echo "valgrind: memory errors in $$t:" >&2; \
	      find $(VALGRIND_LOGS) -name "$$name.*.log" -size +0 -exec cat {} + >&2; \
	      bad="$$bad $$t"; \
	    elif [ $$rc -ne 0 ]; then \
	      echo "valgrind: $$t failed (exit $$rc), no memory error" >&2; slow="$$slow $$t"; fi; \
	  done; done; \
	  [ $$n -gt 0 ] || { echo "valgrind: no test binaries in $(VALGRIND_DIRS)" >&2; exit 1; }; \
	  if [ -n "$$bad" ]; then echo "valgrind: memory errors in:$$bad" >&2; exit 1; fi; \
	  if [ -n "$$slow" ] && [ "$(VALGRIND_TIMING_OK)" != 1 ]; then \
	    echo "valgrind: no memory errors, but tests failed:$$slow" >&2; exit 1; fi; \
	  echo "valgrind: no memory errors in $$n test binaries$${slow:+ (failed under valgrind:$$slow)}"

# make sim SEEDS=N START=S [MODE=safety|liveness] [NODES=3|5]
SEEDS ?= 1000
START ?= 1
MODE ?= safety
NODES ?= 3
sim: all
	@if [ ! -x $(BUILD)/prog/sim ]; then \
	  echo "make sim: the simulator is missing (tests/sim/sim_main.c)" >&2; exit 1; fi
	@$(BUILD)/prog/sim --seeds $(SEEDS) --start $(START) --mode $(MODE) --nodes $(NODES)

# make chaos [DURATION=seconds] [NODES=3|5] [SEED=n] [CHAOS_ARGS="--manual-rejoin
#   --rollback --no-members"] (build/prog/chaos --help)
DURATION ?= 60
SEED ?= 1
CHAOS_ARGS ?=
chaos: all $(CHAOS_EXTRA)
	@if [ ! -x $(BUILD)/prog/chaos ]; then \
	  echo "make chaos: the cluster chaos suite is missing (tests/chaos/chaos_main.c)" >&2; exit 1; fi
	@IDA_BINDIR=$(BINDIR) $(BUILD)/prog/chaos --duration $(DURATION) --nodes $(NODES) --seed $(SEED) $(CHAOS_ARGS)

bench: all
	@if [ -z "$(BENCH_BINS)" ]; then \
	  echo "make bench: no benchmarks yet (tests/*/bench_*.c)" >&2; exit 1; fi
	@set -e; for b in $(BENCH_BINS); do echo "== $$b"; IDA_BINDIR=$(BINDIR) $$b; done
	@if command -v etcd >/dev/null && command -v wrk >/dev/null; then \
	  echo "== scripts/bench/vs-etcd.sh -d $(ETCD_S)"; scripts/bench/vs-etcd.sh -d $(ETCD_S); \
	else echo "== idalloc beside etcd: skipped (apt-get install -y etcd-server etcd-client wrk, or make bench-etcd)"; fi

# make bench-etcd [ETCD_S=s]: idalloc and a 3-node etcd on this machine, side
# by side in one run (scripts/bench/vs-etcd.sh installs etcd and wrk as root).
ETCD_S ?= 10
bench-etcd: programs
	@scripts/bench/vs-etcd.sh -d $(ETCD_S)

# make run [CONF=FILE]: every node of the cluster file in the foreground.
# make node N=ID [CONF=FILE]: node ID alone (restart one that died).
CONF ?= cluster-configs/local-3.conf
run: programs
	@scripts/run-cluster.sh $(CONF)

node: programs
	@if [ -z "$(N)" ]; then \
	  echo "make node: say which node, e.g. make node N=2 (CONF=$(CONF))" >&2; exit 2; fi
	@scripts/run-cluster.sh --node $(N) $(CONF)

FORMAT_SRC = $(shell find base src raft fsm storage tests include -name '*.[ch]' 2>/dev/null)
format:
	@clang-format -i $(FORMAT_SRC)
format-check:
	@clang-format --dry-run -Werror $(FORMAT_SRC)

# The layering rules (docs/DESIGN.md, "Layers"), on sources and objects.
check-layers: build
	@BUILD=$(BUILD) scripts/check-layers.sh

clean:
	rm -rf build bin lib

help:
	@echo "make targets (README.md, \"Make targets\", has the details):"
	@echo "  all           check dependencies; build programs, library, tests, benchmarks (default)"
	@echo "  programs      build only bin/idallocd, bin/idalloc and lib/libidalloc.{a,so}"
	@echo "  test          all, then every test binary; ends with \"N passed, M failed, K skipped\""
	@echo "  run           run every node of CONF (default $(CONF)) in the foreground"
	@echo "  node N=ID     run node ID of CONF alone, e.g. to restart one that died"
	@echo "  sim           the Raft simulator: [SEEDS=N (1000)] [START=S (1)] [MODE=safety|liveness] [NODES=3|5]"
	@echo "  chaos         long fault runs: [DURATION=s] [NODES=3|5] [SEED=n] [CHAOS_ARGS=...]"
	@echo "  bench         every benchmark, with same-run baselines (and beside etcd if installed)"
	@echo "  bench-etcd    idalloc beside a 3-node etcd, same machine, one run [ETCD_S=s]"
	@echo "  asan          the tests under AddressSanitizer + UBSan (build/asan/)"
	@echo "  tsan          the pool's and the client library's tests under ThreadSanitizer (build/tsan/)"
	@echo "  tsan-fsm      the fsm benchmark's two-thread restores, streamed snapshot check and replay under ThreadSanitizer (minutes)"
	@echo "  fsm-soak      longer fsm property runs [FSM_COMMANDS=n] [FSM_SEED=s]"
	@echo "  pool-stress   long lock-free queue stress [POOL_STRESS_SECONDS=n]"
	@echo "  sim-long      many more simulator seeds [SIM_LONG_SEEDS=N]"
	@echo "  chaos-storage many more storage crash rounds [ROUNDS=n] [SEED=s]"
	@echo "  attack-long   the 20,000 idle connection flood [ATTACK_IDLE=n]"
	@echo "  bench-scale   large state vs empty cluster [SCALE_ALLOCS=n] [SCALE_SEQ_BLOCKS=n] [SCALE_PREFIXES=n] [SCALE_SECONDS=s] [SCALE_REPEAT=n] [SCALE_SOAK=s]"
	@echo "  fuzz          every libFuzzer harness of tests/fuzz for FUZZ_S seconds each (default 60)"
	@echo "  fuzz-smoke    every harness for FUZZ_SMOKE_S seconds (default 8), fixed seed; part of test"
	@echo "  valgrind      the unit tests under valgrind (half an hour) [VALGRIND_DIRS=\"fsm pool ...\"]"
	@echo "  format        clang-format the sources"
	@echo "  format-check  fail if a source file is not formatted"
	@echo "  check-layers  fail if raft/ or fsm/ include anything of the I/O world"
	@echo "  install       install under \$$DESTDIR\$$PREFIX (default /usr/local); uninstall"
	@echo "  deb           Debian packages with debhelper, checked by lintian (build/deb/)"
	@echo "  clean         remove build/, bin/, lib/"
	@echo "  help          this list"

# --- rules ------------------------------------------------------------------
$(PROTO_C) $(PROTO_H) &: proto/idalloc.proto
	@mkdir -p $(BUILD)/gen
	$(PROTOC_C) --c_out=$(BUILD)/gen $<

# Generated code: compiled without -Wmissing-prototypes/-Wshadow (not ours).
$(PROTO_O): $(PROTO_C)
	@mkdir -p $(@D)
	$(CC) $(CPPFLAGS) -std=c11 $(OPT) -Wall -Werror -pthread -fPIC \
	    $(if $(SAN),-fsanitize=$(SAN) -fno-omit-frame-pointer) -c $< -o $@

$(BUILD)/obj/%.o: %.c | $(PROTO_H)
	@mkdir -p $(@D)
	$(CC) $(CPPFLAGS) $(CFLAGS) -c $< -o $@

$(LIBIDA): $(call obj,$(LIB_SRC)) $(PROTO_O)
	@mkdir -p $(@D)
	rm -f $@ && ar rcs $@ $^

$(TESTLIB): $(call obj,$(TESTLIB_SRC))
	@mkdir -p $(@D)
	rm -f $@ && ar rcs $@ $^

.SECONDEXPANSION:
$(BUILD)/tests/%: $(BUILD)/obj/tests/%.o $$(call support_of,tests/$$(dir $$*)) \
    $(if $(TESTLIB_SRC),$(TESTLIB)) $(LIBIDA)
	@mkdir -p $(@D)
	$(CC) $(LDFLAGS) $^ -o $@ -lcriterion $(LDLIBS) $(CLI_LDLIBS)

# A literal % in a pattern rule's prerequisites is replaced by the stem
# before the second expansion, so the filters spell it $$(PERCENT).
$(BUILD)/bench/%: $$(call obj,$$(filter $$(PERCENT)/$$*.c,$$(BENCH_SRC))) \
    $$(call support_of,$$(dir $$(filter $$(PERCENT)/$$*.c,$$(BENCH_SRC)))) \
    $(if $(TESTLIB_SRC),$(TESTLIB)) $(LIBIDA)
	@mkdir -p $(@D)
	$(CC) $(LDFLAGS) $^ -o $@ -lcriterion $(LDLIBS) $(CLI_LDLIBS)

$(BUILD)/prog/%: $$(call obj,$$(filter $$(PERCENT)/$$*_main.c,$$(PROG_SRC))) \
    $$(call support_of,$$(dir $$(filter $$(PERCENT)/$$*_main.c,$$(PROG_SRC)))) \
    $(if $(TESTLIB_SRC),$(TESTLIB)) $(LIBIDA)
	@mkdir -p $(@D)
	$(CC) $(LDFLAGS) $^ -o $@ $(LDLIBS) $(CLI_LDLIBS)

$(BINDIR)/idallocd: $(BUILD)/obj/src/node/idallocd_main.o $(LIBIDA)
	@mkdir -p $(@D)
	$(CC) $(LDFLAGS) $^ -o $@ $(LDLIBS)

# The client side needs only protobuf-c, OpenSSL and pthreads (README, "The
# client library"): no libuv, no LMDB.
CLIENT_LDLIBS := -lprotobuf-c -lssl -lcrypto

$(BINDIR)/idalloc: $(BUILD)/obj/src/client/idalloc_main.o $(call obj,$(CLI_SRC)) \
    $(LIBDIR)/libidalloc.a
	@mkdir -p $(@D)
	$(CC) $(LDFLAGS) $^ -o $@ $(CLIENT_LDLIBS) $(CLI_LDLIBS)

$(LIBDIR)/libidalloc.a: $(call obj,$(CLIENT_SRC)) $(PROTO_O)
	@mkdir -p $(@D)
	rm -f $@ && ar rcs $@ $^

# The shared library: SONAME libidalloc.so.$(SOVERSION), the file named by
# the full version, and the two links. It exports only the functions the
# installed headers declare (idalloc_*, not protobuf-c's idalloc__* nor the
# internal ida_*): a version script made from include/idalloc*.h, so a new
# public function is exported as soon as a header declares it.
SOVERSION := 1
IDA_VERSION := $(shell sed -n 's/^\#define IDALLOC_VERSION "\(.*\)"/\1/p' \
    include/idalloc_version.h)
LIBSO_REAL := $(LIBDIR)/libidalloc.so.$(IDA_VERSION)
# --no-undefined: the library names every library it needs. Not with a
# sanitizer: clang leaves the sanitizer runtime to the executable.

$(BUILD)/libidalloc.map: $(wildcard include/idalloc*.h)
	@mkdir -p $(@D)
	@{ echo "{ global:"; \
	   grep -ohE '\bidalloc_[a-z0-9_]+ *\(' $^ | sed 's/ *($$/;/' | \
	     grep -v '^idalloc__' | sort -u; \
	   echo "local: *; };"; } > $@

$(LIBSO_REAL): $(call obj,$(CLIENT_SRC)) $(PROTO_O) $(BUILD)/libidalloc.map
	@mkdir -p $(@D)
	$(CC) -shared $(LDFLAGS) -Wl,-soname,libidalloc.so.$(SOVERSION) \
	    -Wl,--version-script=$(BUILD)/libidalloc.map \
	    $(if $(SAN),,-Wl,--no-undefined) \
	    -Wl,--as-needed $(filter %.o,$^) -o $@ $(CLIENT_LDLIBS)

$(LIBDIR)/libidalloc.so.$(SOVERSION): $(LIBSO_REAL)
	ln -sf libidalloc.so.$(IDA_VERSION) $@

$(LIBDIR)/libidalloc.so: $(LIBDIR)/libidalloc.so.$(SOVERSION)
	ln -sf libidalloc.so.$(SOVERSION) $@

-include $(ALL_OBJ:.o=.d)

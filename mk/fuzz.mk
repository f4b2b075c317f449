# libFuzzer harnesses (tests/fuzz/fuzz_NAME.c, seed corpus in
# tests/fuzz/corpus/NAME/), built with clang and
# -fsanitize=fuzzer,address,undefined in build/fuzz/, apart from the default
# build.
#
#   make fuzz [FUZZ_S=N]   every harness for N seconds (default 60), one after
#                          the other; prints executions/s, coverage and the
#                          corpus size of each; a crash stops the run and
#                          leaves its input in build/fuzz/crashes/
#   make fuzz-smoke        every harness for FUZZ_SMOKE_S seconds (default 8)
#                          with a fixed seed, from the seed corpus only (the
#                          same run whatever earlier runs found): part of
#                          `make test`
#
# New inputs `make fuzz` finds go to build/fuzz/corpus/NAME/ (kept between
# runs), never into the repository's seed corpus. Replay one input:
#   build/fuzz/fuzz_NAME FILE
FUZZ_CC ?= clang
FUZZ_DIR := build/fuzz
FUZZ_S ?= 60
FUZZ_SMOKE_S ?= 8
FUZZ_SAN := address,undefined
FUZZ_NAMES := $(patsubst tests/fuzz/fuzz_%.c,%,$(wildcard tests/fuzz/fuzz_*.c))

.PHONY: fuzz fuzz-smoke fuzz-build fuzz-bins
TEST_EXTRA += fuzz-smoke

# The harnesses and an instrumented libida.a, by a sub-make whose BUILD is
# build/fuzz (so the default build's objects are never mixed in).
fuzz-build: deps
	@$(MAKE) --no-print-directory BUILD=$(FUZZ_DIR) CC=$(FUZZ_CC) \
	    SAN=$(FUZZ_SAN) EXTRA_CFLAGS=-fsanitize=fuzzer-no-link \
	    EXTRA_LDFLAGS=-fsanitize=fuzzer fuzz-bins

fuzz-bins: $(addprefix $(BUILD)/fuzz_,$(FUZZ_NAMES))
	@:

$(BUILD)/fuzz_%: $(BUILD)/obj/tests/fuzz/fuzz_%.o \
    $(BUILD)/obj/tests/fuzz/fuzzsupport.o $(LIBIDA)
	$(CC) $(LDFLAGS) $^ -o $@ $(LDLIBS)

# fuzz_run NAME SECONDS EXTRA_FLAGS WORK_DIR: one harness, its log in
# build/fuzz/NAME.log; prints libFuzzer's last status line.
define fuzz_run
mkdir -p $(4) $(FUZZ_DIR)/crashes; \
if ASAN_OPTIONS=detect_leaks=1 $(FUZZ_DIR)/fuzz_$(1) -max_total_time=$(2) \
    -print_final_stats=1 -artifact_prefix=$(FUZZ_DIR)/crashes/$(1)- $(3) \
    $(4) tests/fuzz/corpus/$(1) \
    >$(FUZZ_DIR)/$(1).log 2>&1; then \
  printf 'fuzz %-9s %s\n' $(1) \
    "$$(grep -E '^#[0-9]+' $(FUZZ_DIR)/$(1).log | tail -1)"; \
  grep -E '^stat::(number_of_executed_units|average_exec_per_sec)' \
    $(FUZZ_DIR)/$(1).log | tr '\n' ' ' | sed 's/^/    /'; echo; \
else \
  tail -40 $(FUZZ_DIR)/$(1).log; \
  echo "fuzz $(1): FAILED (log: $(FUZZ_DIR)/$(1).log; input in $(FUZZ_DIR)/crashes/)" >&2; \
  exit 1; \
fi
endef

fuzz: fuzz-build
	@set -e; $(foreach f,$(FUZZ_NAMES),$(call fuzz_run,$(f),$(FUZZ_S),,$(FUZZ_DIR)/corpus/$(f));)

fuzz-smoke: fuzz-build
	@rm -rf $(FUZZ_DIR)/smoke
	@set -e; $(foreach f,$(FUZZ_NAMES),$(call fuzz_run,$(f),$(FUZZ_SMOKE_S),-seed=1,$(FUZZ_DIR)/smoke/$(f));)

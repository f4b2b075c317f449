# fsm/ extras (auto-included by the Makefile).
#
# Explicit link rule for the fsm benchmark. The Makefile's pattern rule for
# $(BUILD)/bench/% writes `$$(filter %/$$*.c,$$(BENCH_SRC))`; make replaces
# that literal % with the stem before the second expansion, so the rule
# finds no objects and links main-less binaries. An explicit rule wins over
# the pattern rule; drop this once the Makefile is fixed.
$(BUILD)/bench/bench_fsm: $(BUILD)/obj/tests/fsm/bench_fsm.o \
    $(BUILD)/obj/tests/fsm/fsm_helpers.o $(LIBIDA)
	@mkdir -p $(@D)
	$(CC) $(LDFLAGS) $^ -o $@ $(LDLIBS)

# Longer property runs of fsm/ against its reference model:
#   make fsm-soak [FSM_COMMANDS=n] [FSM_SEED=s]
# runs 4 seeds (s+1 .. s+4) of n commands each (default 5,000,000).
FSM_COMMANDS ?= 5000000
FSM_SEED ?= 0
.PHONY: fsm-soak
fsm-soak: all
	IDA_FSM_PROPERTY_COMMANDS=$(FSM_COMMANDS) IDA_FSM_PROPERTY_SEED=$(FSM_SEED) \
	    $(BUILD)/tests/fsm/test_fsm_property --jobs 2 --verbose

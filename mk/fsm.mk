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

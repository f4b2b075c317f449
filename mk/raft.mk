# Raft core and simulator (issue 4).
#
# Explicit link rule for build/prog/sim. The generic $(BUILD)/prog/% rule in
# the Makefile links no object for tests/DIR/NAME_main.c: with secondary
# expansion, make replaces the `%` of `$$(filter %/$$*_main.c,...)` by the
# stem before filtering, so the filter pattern loses its wildcard (see the
# issue 4 report for the one-line Makefile fix). This rule can go once that
# is fixed.
$(BUILD)/prog/sim: $(BUILD)/obj/tests/sim/sim_main.o $(call support_of,tests/sim/) $(LIBIDA)
	@mkdir -p $(@D)
	$(CC) $(LDFLAGS) $^ -o $@ $(LDLIBS)

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

# make sim-long [SIM_LONG_SEEDS=N]: many more seeds than `make test` runs, in
# both modes and both cluster sizes, from seeds make test never uses. Part of
# `make chaos` (CHAOS_EXTRA).
SIM_LONG_SEEDS ?= 20000
.PHONY: sim-long
sim-long: $(BUILD)/prog/sim
	@set -e; for mode in safety liveness; do for n in 3 5; do \
	  echo "sim-long: $$mode, $$n nodes, seeds 100001.."; \
	  $(BUILD)/prog/sim --seeds $(SIM_LONG_SEEDS) --start 100001 --mode $$mode --nodes $$n; \
	done; done
CHAOS_EXTRA += sim-long

# Raft core and simulator.
#
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

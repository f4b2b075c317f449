# Pool module targets (auto-included by the Makefile).
#
# Explicit link rule for the pool benchmark: the Makefile's pattern rule for
# $(BUILD)/bench/% writes `$$(filter %/$$*.c,...)` among its prerequisites,
# and make replaces that literal % with the stem before the second expansion,
# so the rule links no object and fails with "undefined reference to main".
# An explicit rule takes precedence over the pattern rule. Remove this once
# the Makefile rule is fixed (see the pool report).
$(BUILD)/bench/bench_pool: $(BUILD)/obj/tests/pool/bench_pool.o $(LIBIDA)
	@mkdir -p $(@D)
	$(CC) $(LDFLAGS) $^ -o $@ $(LDLIBS)

# The same for the queue stress program (pattern rule $(BUILD)/prog/%).
$(BUILD)/prog/qstress: $(BUILD)/obj/tests/pool/qstress_main.o $(LIBIDA)
	@mkdir -p $(@D)
	$(CC) $(LDFLAGS) $^ -o $@ $(LDLIBS)

# make pool-stress [POOL_STRESS_SECONDS=n]: long stress of the lock-free
# queue (rounds of P producers x C consumers on tiny queues, exact counts,
# livelock watchdog). Also run by `make chaos`.
POOL_STRESS_SECONDS ?= 20
.PHONY: pool-stress
pool-stress: $(BUILD)/prog/qstress
	$(BUILD)/prog/qstress $(POOL_STRESS_SECONDS)
CHAOS_EXTRA += pool-stress

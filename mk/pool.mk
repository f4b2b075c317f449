# Pool module targets (auto-included by the Makefile).
#
# make pool-stress [POOL_STRESS_SECONDS=n]: long stress of the lock-free
# queue (rounds of P producers x C consumers on tiny queues, exact counts,
# livelock watchdog). Also run by `make chaos`.
POOL_STRESS_SECONDS ?= 20
.PHONY: pool-stress
pool-stress: $(BUILD)/prog/qstress
	$(BUILD)/prog/qstress $(POOL_STRESS_SECONDS)
CHAOS_EXTRA += pool-stress

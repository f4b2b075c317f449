# storage/ targets.
#
# make chaos-storage [ROUNDS=n] [SEED=s]: many more kill -9 crash rounds than
# `make test` runs (60). Part of `make chaos`.
ROUNDS ?= 2000
.PHONY: chaos-storage
chaos-storage: all
	@$(BUILD)/prog/storage_crash --rounds $(ROUNDS) --seed $(SEED)
CHAOS_EXTRA += chaos-storage

# make tsan-storage: the storage threading contract (owner thread writing and
# growing the map, reader threads on entries and snapshot chunks) under
# ThreadSanitizer. A plain program, not Criterion: Criterion aborts at start
# under TSan on this machine ("Could not initialize inheritable arena").
.PHONY: tsan-storage
tsan-storage: deps
	@$(MAKE) --no-print-directory BUILD=build/tsan SAN=thread \
	    build/tsan/prog/storage_threads
	@TSAN_OPTIONS=halt_on_error=1 build/tsan/prog/storage_threads

# storage/ targets.
#
# make chaos-storage [ROUNDS=n] [SEED=s]: many more kill -9 crash rounds than
# `make test` runs (60). Part of `make chaos`.
ROUNDS ?= 2000
.PHONY: chaos-storage
chaos-storage: all
	@$(BUILD)/prog/storage_crash --rounds $(ROUNDS) --seed $(SEED)
CHAOS_EXTRA += chaos-storage

# storage/ targets (issue 5).
#
# The generic $(BUILD)/prog/% and $(BUILD)/bench/% rules of the Makefile
# expand `%` inside their secondary-expansion filters to the stem, so they
# find no objects for any helper or benchmark (reported with issue 5); until
# that is fixed these explicit rules, which take precedence, build ours.
STORAGE_SUPPORT := $(call support_of,tests/storage/)
$(BUILD)/prog/storage_crash: $(BUILD)/obj/tests/storage/storage_crash_main.o \
    $(STORAGE_SUPPORT) $(LIBIDA)
	@mkdir -p $(@D)
	$(CC) $(LDFLAGS) $^ -o $@ $(LDLIBS)
$(BUILD)/bench/bench_storage: $(BUILD)/obj/tests/storage/bench_storage.o \
    $(STORAGE_SUPPORT) $(LIBIDA)
	@mkdir -p $(@D)
	$(CC) $(LDFLAGS) $^ -o $@ $(LDLIBS)

# make chaos-storage [ROUNDS=n] [SEED=s]: many more kill -9 crash rounds than
# `make test` runs (60). Part of `make chaos`.
ROUNDS ?= 2000
.PHONY: chaos-storage
chaos-storage: all
	@$(BUILD)/prog/storage_crash --rounds $(ROUNDS) --seed $(SEED)
CHAOS_EXTRA += chaos-storage
# CHAOS_EXTRA is expanded when the Makefile reads the chaos rule, before
# mk/*.mk is included, so the line above alone does not reach it: add the
# prerequisite to the chaos target directly as well.
chaos: chaos-storage

# make tsan-storage: the storage threading contract (owner thread writing and
# growing the map, reader threads on entries and snapshot chunks) under
# ThreadSanitizer. A plain program, not Criterion: Criterion aborts at start
# under TSan on this machine ("Could not initialize inheritable arena").
.PHONY: tsan-storage
tsan-storage: deps
	@$(MAKE) --no-print-directory BUILD=build/tsan SAN=thread \
	    build/tsan/prog/storage_threads
	@TSAN_OPTIONS=halt_on_error=1 build/tsan/prog/storage_threads
$(BUILD)/prog/storage_threads: \
    $(BUILD)/obj/tests/storage/storage_threads_main.o $(STORAGE_SUPPORT) \
    $(LIBIDA)
	@mkdir -p $(@D)
	$(CC) $(LDFLAGS) $^ -o $@ $(LDLIBS)

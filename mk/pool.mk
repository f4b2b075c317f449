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

# The chaos suite's connect() shim (tests/chaos/shim/connect_shim.c): the
# chaos run preloads it into its idallocd processes so that their peer
# links go through the fault proxy while every address they know is the
# real one. Built with the chaos binaries, without sanitizers (it is
# loaded into the nodes of an ASan build too); not part of libida or the
# programs.
CHAOS_SHIM := $(BUILD)/lib/ida_chaos_shim.so

$(CHAOS_SHIM): tests/chaos/shim/connect_shim.c
	@mkdir -p $(dir $@)
	$(CC) -std=c11 -O2 -g $(WARN) -D_GNU_SOURCE -fPIC -shared $< -o $@ -ldl

$(BUILD)/tests/chaos/test_chaos $(BUILD)/prog/chaos: $(CHAOS_SHIM)

# make bench-scale: the cluster with a large state beside the same run's
# empty cluster (tests/scale/scale_main.c; README, "Make targets").
#
#   make bench-scale [SCALE_ALLOCS=n] [SCALE_SEQ_BLOCKS=n] [SCALE_PREFIXES=n]
#                    [SCALE_SECONDS=s] [SCALE_REPEAT=n] [SCALE_SOAK=s]
#
# SCALE_ALLOCS live tagged allocations in a bounded pool, SCALE_SEQ_BLOCKS
# sequence blocks (reserve) and SCALE_PREFIXES prefixes are written through
# a 3-node cluster; SCALE_SECONDS is the length of each load window;
# SCALE_REPEAT (default 3) restarts and catch-ups are measured per phase
# (the median and the slowest are reported); SCALE_SOAK (default 0: none)
# seconds of the same load follow on the full cluster, its state growing
# (leader changes, unknowns, VmRSS per live allocation sampled). The
# defaults finish in a few minutes on a small machine.
SCALE_ALLOCS ?= 300000
SCALE_SEQ_BLOCKS ?= 30000
SCALE_PREFIXES ?= 10000
SCALE_SECONDS ?= 20
SCALE_REPEAT ?= 3
SCALE_SOAK ?= 0
.PHONY: bench-scale
bench-scale: $(BUILD)/prog/scale $(PROGRAMS)
	IDA_BINDIR=$(BINDIR) $(BUILD)/prog/scale --allocs $(SCALE_ALLOCS) \
	    --seq-blocks $(SCALE_SEQ_BLOCKS) --prefixes $(SCALE_PREFIXES) \
	    --seconds $(SCALE_SECONDS) --repeat $(SCALE_REPEAT) \
	    --soak $(SCALE_SOAK)

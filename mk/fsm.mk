# fsm/ extras (auto-included by the Makefile).
#
# Longer property runs of fsm/ against its reference model:
#   make fsm-soak [FSM_COMMANDS=n] [FSM_SEED=s]
# runs 4 seeds (s+1 .. s+4) of n commands each (default 5,000,000).
FSM_COMMANDS ?= 5000000
FSM_SEED ?= 0
.PHONY: fsm-soak
fsm-soak: all
	IDA_FSM_PROPERTY_COMMANDS=$(FSM_COMMANDS) IDA_FSM_PROPERTY_SEED=$(FSM_SEED) \
	    $(BUILD)/tests/fsm/test_fsm_property --jobs 2 --verbose

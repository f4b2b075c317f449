# Attack reproductions (issue 16) that take longer than `make test` allows.
#
# make attack-long [ATTACK_IDLE=n]: the idle-connection flood of
# tests/cluster/test_attack_client.c with the issue's 20,000 connections
# against a leader running with the machine's descriptor limit (make test
# runs 3,000 against nodes limited to 2,048 descriptors).
ATTACK_IDLE ?= 20000
.PHONY: attack-long
attack-long: $(BUILD)/tests/cluster/test_attack_client $(BUILD)/prog/forge $(PROGRAMS)
	IDA_BUILD=$(BUILD) IDA_BINDIR=$(BINDIR) IDA_ATTACK_IDLE_CONNECTIONS=$(ATTACK_IDLE) \
	    $(BUILD)/tests/cluster/test_attack_client --filter '*/idle_flood' --verbose

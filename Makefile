# converger: thin wrapper over CMake.
#   make                build
#   make run            build the node, the demo page and the C library, and start a
#                       node on 127.0.0.1:8080 (SQLite in data/);
#                       flags of converger serve in ARGS, e.g. ARGS="--listen 127.0.0.1:8081"
#   make cluster        build and start three nodes (PostgreSQL) behind HAProxy on
#                       127.0.0.1:8080, until Ctrl-C (scripts/cluster --help);
#                       ARGS=--tls: HTTPS and WSS on 127.0.0.1:8443 too;
#                       ARGS=--sharded: three PostgreSQL shards (one with a
#                       standby) and two Redis bus instances instead of one
#                       PostgreSQL
#   make test           build and run every test through CTest
#   make test SANITIZE=1  the same under ASan + UBSan
#   make chaos-sharded  build and run the sharded chaos run for 300 s (integration.
#                       test_sharded_chaos; make test runs it for 60 s): 3 nodes, 3
#                       PostgreSQL shards, 2 Redis bus instances, 32 REST senders and
#                       500 subscribers through a primary's SIGKILL and promotion, a
#                       bus instance's and a node's SIGKILL and restart, and a drain;
#                       it prints acknowledged, lost, delivered twice and gaps.
#                       CHAOS_SECONDS=N for another length
SANITIZE ?= 0
ifeq ($(SANITIZE),1)
BUILD_DIR ?= build-sanitize
CMAKE_FLAGS += -DCONVERGER_SANITIZE=ON -DCMAKE_BUILD_TYPE=Debug
else
BUILD_DIR ?= build
CMAKE_FLAGS += -DCMAKE_BUILD_TYPE=RelWithDebInfo
endif
JOBS ?= $(shell nproc 2>/dev/null || echo 2)

.PHONY: all build setup run cluster test chaos-sharded clean

all: build

setup:
	@scripts/setup

$(BUILD_DIR)/CMakeCache.txt:
	@cmake -S . -B $(BUILD_DIR) $(CMAKE_FLAGS) >/dev/null

build: setup $(BUILD_DIR)/CMakeCache.txt
	@cmake --build $(BUILD_DIR) -j $(JOBS) -- --no-print-directory

# $(call foreground,COMMAND): run COMMAND so that Ctrl-C at a terminal ends
# it, not make. At a terminal, Ctrl-C signals the whole foreground process
# group, make included, and make then reports "Interrupt" and dies of SIGINT
# whatever the recipe's status. So when that group is make's (stderr a
# terminal, and this shell's process group the terminal's), COMMAND runs as
# the job of a job-control shell (bash -m): in a process group of its own,
# given the terminal, so that only it gets Ctrl-C; bash gives the terminal
# back to make when it ends. Ctrl-Z is ignored there: a stopped job would end
# the recipe and leave COMMAND behind. Elsewhere (make run &, no terminal)
# COMMAND runs in make's group, as any recipe. COMMAND holds no single quote.
foreground = read -r _ _ _ _ pgrp _ _ tpgid _ </proc/$$$$/stat; \
	if [ -t 2 ] && [ "$$pgrp" = "$$tpgid" ]; then exec bash -mc "trap '' TSTP; "'$(1)'; \
	else $(1); fi

# The node exits 0 on Ctrl-C (SIGINT: 1001 to every socket) and on SIGTERM.
run: setup $(BUILD_DIR)/CMakeCache.txt
	@cmake --build $(BUILD_DIR) -j $(JOBS) --target converger converger_web converger_client converger_client_static -- --no-print-directory
	@echo $(BUILD_DIR)/converger serve $(ARGS)
	@$(call foreground,$(BUILD_DIR)/converger serve $(ARGS))

# build has run scripts/setup (haproxy included): the script only starts things.
# Ctrl-C (130) and SIGTERM (143) are how it is meant to end: not an error.
CLUSTER_RUN = scripts/cluster --binary $(BUILD_DIR)/converger $(ARGS); s=$$?; [ $$s -eq 0 ] || [ $$s -eq 130 ] || [ $$s -eq 143 ]
cluster: build
	@$(call foreground,$(CLUSTER_RUN))

test: build
	cd $(BUILD_DIR) && ctest --output-on-failure -j $(JOBS) $(CTEST_ARGS)

CHAOS_SECONDS ?= 300
chaos-sharded: build
	CONVERGER_CHAOS_SECONDS=$(CHAOS_SECONDS) CONVERGER_SDK_SWARM=$(BUILD_DIR)/sdk_swarm \
	  $$(test -x /usr/bin/python3 && echo /usr/bin/python3 || echo python3) \
	  tests/integration/test_sharded_chaos.py --binary $(BUILD_DIR)/converger

clean:
	rm -rf build build-sanitize

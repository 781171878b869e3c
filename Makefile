# converger: thin wrapper over CMake.
#   make                build
#   make run            build and start a node on 127.0.0.1:8080 (SQLite in data/)
#   make cluster        build and start three nodes (PostgreSQL) behind HAProxy on
#                       127.0.0.1:8080, until Ctrl-C (scripts/cluster --help)
#   make test           build and run every test through CTest
#   make test SANITIZE=1  the same under ASan + UBSan
SANITIZE ?= 0
ifeq ($(SANITIZE),1)
BUILD_DIR ?= build-sanitize
CMAKE_FLAGS += -DCONVERGER_SANITIZE=ON -DCMAKE_BUILD_TYPE=Debug
else
BUILD_DIR ?= build
CMAKE_FLAGS += -DCMAKE_BUILD_TYPE=RelWithDebInfo
endif
JOBS ?= $(shell nproc 2>/dev/null || echo 2)

.PHONY: all build setup run cluster test clean

all: build

setup:
	@scripts/setup

$(BUILD_DIR)/CMakeCache.txt:
	@cmake -S . -B $(BUILD_DIR) $(CMAKE_FLAGS) >/dev/null

build: setup $(BUILD_DIR)/CMakeCache.txt
	@cmake --build $(BUILD_DIR) -j $(JOBS) -- --no-print-directory

run: setup $(BUILD_DIR)/CMakeCache.txt
	@cmake --build $(BUILD_DIR) -j $(JOBS) --target converger -- --no-print-directory
	$(BUILD_DIR)/converger serve $(ARGS)

# build has run scripts/setup (haproxy included): the script only starts things.
# Ctrl-C (130) and SIGTERM (143) are how it is meant to end: not an error.
# At a terminal, Ctrl-C signals the whole foreground process group, make
# included, and make then reports "Interrupt" and dies of SIGINT whatever the
# recipe's status. So when that group is make's (stderr a terminal, and this
# shell's process group the terminal's), the script runs as the job of a
# job-control shell (bash -m): in a process group of its own, given the
# terminal, so that only the script gets Ctrl-C; bash gives the terminal back
# to make when it ends. Ctrl-Z is ignored there: a stopped job would end the
# recipe and leave the script behind. Elsewhere (make cluster &, no terminal)
# the script runs in make's group, as any recipe.
CLUSTER_RUN = scripts/cluster --binary $(BUILD_DIR)/converger; s=$$?; [ $$s -eq 0 ] || [ $$s -eq 130 ] || [ $$s -eq 143 ]
cluster: build
	@read -r _ _ _ _ pgrp _ _ tpgid _ </proc/$$$$/stat; \
	if [ -t 2 ] && [ "$$pgrp" = "$$tpgid" ]; then exec bash -mc "trap '' TSTP; "'$(CLUSTER_RUN)'; \
	else $(CLUSTER_RUN); fi

test: build
	cd $(BUILD_DIR) && ctest --output-on-failure -j $(JOBS) $(CTEST_ARGS)

clean:
	rm -rf build build-sanitize

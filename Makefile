# Tandem: the two commands a user needs, plus the developer loop.
#   make setup   install everything (Debian apt + npm), idempotent
#   make run     run the main job on the built-in demo
#   make test    build and run every test tier through ctest
BUILD ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=
CTEST_FLAGS ?=

.PHONY: all setup build test run clean

all: build

setup:
	bash scripts/setup.sh

$(BUILD)/CMakeCache.txt:
	cmake -S . -B $(BUILD) -DTANDEM_WERROR=ON $(CMAKE_FLAGS)

build: $(BUILD)/CMakeCache.txt
	cmake --build $(BUILD) -j $(JOBS)

test: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS) $(CTEST_FLAGS)

# Only the tandem binary: a newcomer's first run need not wait for every test and benchmark.
run: $(BUILD)/CMakeCache.txt
	cmake --build $(BUILD) --target tandem -j $(JOBS)
	bash scripts/demo.sh $(BUILD)

clean:
	rm -rf $(BUILD)

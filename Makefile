# tvmfuse: `make demo` runs the main job, `make test` runs the tests.
# Both create .venv from pyproject.toml on first use and refresh it when pyproject.toml changes.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# empty: the best target this CPU runs (avx512, avx2, ...); `make demo TARGET=x86-64` picks one
TARGET ?=
PYTEST_ARGS ?=
# pytest-xdist workers, one a core of the 2-core machines CI and the sessions run on: one test
# process kept about one core busy (Zen 3, default run: 33 min in one process; 17-19 min in two,
# with 400 s of it moved to the slow set). Whole files go to one worker, so a module's fixtures
# (a model built once) are not built twice.
TEST_JOBS ?= 2

.PHONY: demo test lint test-arm test-slow sysdeps arm-sysdeps clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test,onnx,models,bench,openvino]'
	touch $(STAMP)

# The aarch64 cross linker for the arm64 target (Debian's package; needs root or sudo).
sysdeps:
	@command -v aarch64-linux-gnu-g++ >/dev/null || { \
	  echo "installing g++-aarch64-linux-gnu for the arm64 target"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq g++-aarch64-linux-gnu >/dev/null; }

# The emulated arm64 host (`tvmfuse arm-host`): debootstrap, and qemu-user run by the kernel for
# aarch64 binaries (binfmt_misc). Needs root.
arm-sysdeps: sysdeps
	@command -v debootstrap >/dev/null && [ -e /usr/libexec/qemu-binfmt/aarch64-binfmt-P ] || { \
	  echo "installing debootstrap and qemu-user-static for the emulated arm64 host"; \
	  apt-get update -qq && apt-get install -y -qq debootstrap qemu-user-static binfmt-support >/dev/null; }
	@# a machine that cannot register binfmt handlers (a container without privileges) cannot
	@# emulate: the arm tests then skip, naming the reason
	@[ -e /proc/sys/fs/binfmt_misc/register ] || mount -t binfmt_misc binfmt_misc \
	  /proc/sys/fs/binfmt_misc || echo "warning: cannot mount binfmt_misc: no arm64 emulation"
	@[ -e /proc/sys/fs/binfmt_misc/qemu-aarch64 ] || update-binfmts --enable qemu-aarch64 \
	  || echo "warning: cannot register qemu-aarch64: no arm64 emulation"

demo: $(STAMP)
	$(BIN)/tvmfuse build resnet50 $(if $(TARGET),--target $(TARGET)) -o build/resnet50 --verify --bench

# ruff, configured in pyproject.toml: zero findings, or CI fails
lint: $(STAMP)
	$(BIN)/ruff check .

test: $(STAMP) sysdeps
	$(BIN)/python -m pytest -n $(TEST_JOBS) --dist loadfile $(PYTEST_ARGS)

# the long fault-injection runs (tuning jobs killed at many points), whose results
# docs/reliability.md records
test-slow: $(STAMP)
	$(BIN)/python -m pytest -m slow -n $(TEST_JOBS) --dist loadfile $(PYTEST_ARGS)

# arm64 builds run and tuned over RPC on the emulated host (its root is made once, ~4 minutes).
test-arm: $(STAMP) arm-sysdeps
	$(BIN)/python -m pytest -m arm $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) build

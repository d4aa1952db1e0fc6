# tvmfuse: `make demo` runs the main job, `make test` runs the tests.
# Both create .venv from pyproject.toml on first use and refresh it when pyproject.toml changes.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
TARGET ?= avx512
PYTEST_ARGS ?=

.PHONY: demo test test-slow sysdeps clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test,onnx,models,bench]'
	touch $(STAMP)

# The aarch64 cross linker for the arm64 target (Debian's package; needs root or sudo).
sysdeps:
	@command -v aarch64-linux-gnu-g++ >/dev/null || { \
	  echo "installing g++-aarch64-linux-gnu for the arm64 target"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq g++-aarch64-linux-gnu >/dev/null; }

demo: $(STAMP)
	$(BIN)/tvmfuse build resnet50 --target $(TARGET) -o build/resnet50 --verify --bench

test: $(STAMP) sysdeps
	$(BIN)/python -m pytest $(PYTEST_ARGS)

test-slow: $(STAMP) sysdeps
	$(BIN)/python -m pytest -m slow $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) build

"""The frozen modules' file names in ``inspect``'s cache: the stack TVMScript's decorators read
is unchanged, and a frozen frame's module is found without walking ``sys.modules``."""

import importlib
import inspect
import sys

from tvmfuse.inspect_cache import cache_frozen_module_files

IMPORTING = "<frozen importlib._bootstrap>"


def _stack_inside_import(folder, name: str) -> list:
    """``inspect.stack()`` as a module two imports deep sees it (filename, line, function,
    source line), from one call site."""
    (folder / f"{name}_outer.py").write_text(f"import {name}_inner\n")
    (folder / f"{name}_inner.py").write_text(
        "import inspect\n"
        "STACK = [(f.filename, f.lineno, f.function, f.code_context, f.index)\n"
        "         for f in inspect.stack()]\n")
    importlib.import_module(f"{name}_outer")
    stack = sys.modules[f"{name}_inner"].STACK
    del sys.modules[f"{name}_outer"], sys.modules[f"{name}_inner"]
    return stack


def test_the_stack_inside_an_import_is_the_same_with_frozen_names_cached(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    for filename in [f for f in inspect.modulesbyfile if f.startswith("<frozen ")]:
        monkeypatch.delitem(inspect.modulesbyfile, filename)
    assert inspect.getmodule(sys._getframe(), IMPORTING) is None  # found only by a full walk
    stacks = []
    for cached in (False, True):  # one call site, so that the test's own frame is the same
        if cached:
            cache_frozen_module_files()
        stacks.append(_stack_inside_import(tmp_path, "ctm_a"))
    without, with_names = stacks
    assert with_names == without
    assert any(frame[0] == IMPORTING for frame in with_names)
    assert inspect.getmodule(sys._getframe(), IMPORTING) is sys.modules["importlib._bootstrap"]

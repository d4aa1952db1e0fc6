"""TVMScript's decorators made cheap inside imports: the frozen modules' file names in
``inspect``'s cache.

Every ``@T.prim_func`` and ``@I.ir_module`` calls ``inspect.stack()``, which asks
``inspect.getmodule`` for each frame's module. For a frame of a frozen module, such as the
``<frozen importlib._bootstrap>`` frames of every import under way, its cache never answers
(those modules' ``__file__`` is not that name), so each such frame walks all of
``sys.modules``: a decorator run inside a deep import chain costs milliseconds, and importing
``tvm.s_tir.tensor_intrin.cuda`` (496 decorated functions, which the CUDA tensor-core schedules
need) took 28.5 s on a 2-core Zen 4 (``python -c "import tvm; import
tvm.s_tir.tensor_intrin.cuda"``), 4.5 s with the names cached. The names map to the module
``getmodule`` would otherwise not find; what ``inspect.stack()`` returns is unchanged (such
frames have no source either way).
"""

from __future__ import annotations

import inspect
import sys


def cache_frozen_module_files() -> None:
    """Enter each loaded frozen module's file name (``<frozen NAME>``) in ``inspect``'s
    filename-to-module cache."""
    for name, module in list(sys.modules.items()):
        spec = getattr(module, "__spec__", None)
        if spec is None or spec.origin != "frozen":
            continue
        original = getattr(spec.loader_state, "origname", None) or name
        inspect.modulesbyfile.setdefault(
            f"<frozen {original}>", original if original in sys.modules else name)

"""The tensor intrinsics a MetaSchedule search for one target needs, registered without the rest.

MetaSchedule's ``TuneContext`` imports ``tvm.s_tir.tensor_intrin``, whose ``__init__`` registers
every target's intrinsics, CUDA's first: half a minute on two cores (``python -c "import
tvm.s_tir.tensor_intrin.cuda"``; ``import tvm`` takes a few seconds), paid by every ``tvmfuse
tune`` on a CPU before its first trial. :func:`register_for` imports only the target's own
module (``x86``, ``arm_cpu`` or ``cuda``) under the package left unexecuted, so that the import in
``TuneContext`` finds the package already there. Another target's module can still be imported
later in the same process (``import tvm.s_tir.tensor_intrin.cuda``, as the CUDA matmul rule does).
"""

from __future__ import annotations

import importlib
import importlib.util
import sys

PACKAGE = "tvm.s_tir.tensor_intrin"


def register_for(target) -> None:
    """Register the tensor intrinsics of ``target`` (a ``tvm.target.Target``)."""
    if PACKAGE not in sys.modules:
        import tvm.s_tir  # noqa: PLC0415 - the parent package, run as usual

        spec = importlib.util.find_spec(PACKAGE)
        package = importlib.util.module_from_spec(spec)  # its __init__ not run
        sys.modules[PACKAGE] = package
        tvm.s_tir.tensor_intrin = package
    importlib.import_module(f"{PACKAGE}.{_module_for(target)}")


def _module_for(target) -> str:
    if target.kind.name == "cuda":
        return "cuda"
    triple = str(target.attrs.get("mtriple", "")) if target.attrs is not None else ""
    return "arm_cpu" if triple.startswith(("aarch64", "arm")) else "x86"

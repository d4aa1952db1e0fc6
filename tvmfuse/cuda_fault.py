"""A CUDA error at run time as one line naming the CUDA error and, where it can be found, the
kernel that raised it.

A kernel's fault (a misaligned or illegal address) is reported asynchronously, by whichever
CUDA call comes next (a copy, a synchronisation), whose error names no kernel; and the fault
leaves the process's CUDA context unusable, so nothing can be run again in it to find the
kernel. :func:`first_failing_kernel` therefore runs the library once more in a child process
with ``CUDA_LAUNCH_BLOCKING=1``, synchronising after every call of ``main`` (a VM instrument),
so the call whose synchronisation fails is the kernel that faulted; the child prints it as TVM's
launch error does (``// func_name=...``), which names it only where the launch itself fails.

``python -m tvmfuse.cuda_fault LIBRARY INPUTS.npz`` is that child: it runs ``main`` of the
library on the GPU on the arrays of ``INPUTS.npz``, in order.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

#: A CUDA error as the runtimes spell it: TVM's "cudaErrorMisalignedAddress (716): misaligned
#: address", the driver's "CUDA_ERROR_MISALIGNED_ADDRESS", PyTorch's "CUDA error: misaligned
#: address".
_CUDA_ERROR = re.compile(r"cudaError\w+(?: \(\d+\))?(?:: [^\n]*)?|CUDA_ERROR_\w+"
                         r"|CUDA error: [^\n]*")
#: The kernel TVM's launch error names.
_KERNEL = re.compile(r"func_name=(\w+)")
#: Seconds the child that looks for the failing kernel may take (a build's one run, and the
#: library's load: CUDA sources are compiled when it loads).
PROBE_SECONDS = 300


#: The CUDA errors this process has described: after one the process's CUDA context is lost,
#: and every later free of device memory raises inside a destructor (std::terminate), so the
#: command line ends the process without freeing (:func:`tvmfuse.cli.main`).
LOST: list[str] = []


def cuda_error(err: BaseException | str) -> str | None:
    """The CUDA error in ``err``'s text (one line), or None when it is not a CUDA error."""
    found = _CUDA_ERROR.search(str(err))
    return found.group(0).strip() if found else None


def kernel_named(text: str) -> str | None:
    """The kernel a TVM launch error names, if any."""
    found = _KERNEL.search(text)
    return found.group(1) if found else None


def describe(err: BaseException, library: Path | None = None,
             arrays: list[np.ndarray] | None = None) -> str | None:
    """One line for a CUDA error at run time: the CUDA error and the kernel, from ``err``'s text
    or else found by :func:`first_failing_kernel` running ``library`` on ``arrays`` again.
    None when ``err`` is not a CUDA error."""
    error = cuda_error(err)
    if error is None:
        return None
    LOST.append(error)
    kernel = kernel_named(str(err))
    if kernel is None and library is not None and arrays is not None:
        kernel = first_failing_kernel(library, arrays)
    where = f" in kernel {kernel}" if kernel else ""
    return f"CUDA error {error}{where}"


def first_failing_kernel(library: Path, arrays: list[np.ndarray]) -> str | None:
    """The kernel whose launch fails when ``library`` runs ``main`` on ``arrays`` with every
    launch synchronous (in a child process: see the module doc); None when that run names none
    (it passed, or failed elsewhere) or cannot run. Where launches are already synchronous this
    process's error would have named it: no child then."""
    if os.environ.get("CUDA_LAUNCH_BLOCKING") == "1":
        return None
    with tempfile.TemporaryDirectory(prefix="tvmfuse-cuda-fault-") as scratch:
        inputs = Path(scratch) / "inputs.npz"
        np.savez(inputs, *arrays)
        try:
            child = subprocess.run(
                [sys.executable, "-m", __name__, str(library), str(inputs)],
                env={**os.environ, "CUDA_LAUNCH_BLOCKING": "1"}, capture_output=True,
                text=True, timeout=PROBE_SECONDS, check=False)
        except (OSError, subprocess.TimeoutExpired):
            return None
    return kernel_named(child.stdout + child.stderr)


def _run_once(library: str, inputs: str) -> None:
    import tvm  # noqa: PLC0415
    from tvm import relax  # noqa: PLC0415

    device = tvm.cuda(0)
    vm = relax.VirtualMachine(tvm.runtime.load_module(library), device)
    with np.load(inputs) as saved:
        args = [tvm.runtime.tensor(saved[f"arr_{i}"], device) for i in range(len(saved.files))]
    run_call_by_call(vm, device, args)


def run_call_by_call(vm, device, args) -> None:
    """Run ``main`` synchronising ``device`` after each kernel it calls; when one fails, print
    the call's name as ``// func_name=NAME`` (what :func:`kernel_named` reads) and raise."""
    current = [None]

    def instrument(_func, symbol, before, _ret, *_args) -> None:
        if before:
            current[0] = symbol
        elif not symbol.startswith("vm.builtin."):
            device.sync()

    vm.set_instrument(instrument)
    try:
        vm["main"](*args)
        device.sync()
    except Exception:
        if current[0] is not None:
            print(f"// func_name={current[0]}", flush=True)
        raise


if __name__ == "__main__":
    _run_once(*sys.argv[1:3])

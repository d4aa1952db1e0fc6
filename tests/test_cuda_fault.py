"""A CUDA error at run time is one line naming the CUDA error and the kernel: formatted from
fake errors here (no GPU needed); tests/test_suite.py's cuda tests run the real thing."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import tvm
from tvm import relax, te

from tvmfuse import TvmfuseError, api, cli, cuda_fault
from tvmfuse.compiler import cuda_source
from tvmfuse.runtime import Deployed

from cuda_alignment import misaligned

#: What TVM raises at the synchronisation after a kernel faulted (no kernel named).
ASYNC = ("CUDA Runtime Error: cudaErrorMisalignedAddress (716): misaligned address\n"
         "Stack trace:\n  File \"cuda_device_api.cc\", line 230")
#: What TVM raises when the launch itself fails (launches synchronous): the kernel and its source.
LAUNCH = ("CUDALaunch Error: CUDA_ERROR_MISALIGNED_ADDRESS\n grid=(4,1,1),  block=(128,1,1)\n"
          "// func_name=fused_conv2d_add_kernel\n// CUDA Source\n// -----------\n"
          "extern \"C\" __global__ void fused_conv2d_add_kernel(half* a) {}")


def test_a_cuda_error_is_one_line_with_the_kernel_it_names():
    assert cuda_fault.describe(RuntimeError(ASYNC)) == (
        "CUDA error cudaErrorMisalignedAddress (716): misaligned address")
    assert cuda_fault.describe(RuntimeError(LAUNCH)) == (
        "CUDA error CUDA_ERROR_MISALIGNED_ADDRESS in kernel fused_conv2d_add_kernel")
    assert cuda_fault.describe(RuntimeError("CUDA error: an illegal memory access was "
                                            "encountered")) == (
        "CUDA error CUDA error: an illegal memory access was encountered")
    assert cuda_fault.describe(ValueError("Check failed: x == y")) is None


def test_the_failing_kernel_is_found_by_synchronous_launches(monkeypatch, tmp_path):
    calls = []

    def child(command, env, **kwargs):
        calls.append((command, env))
        saved = np.load(command[-1])
        assert [saved[f] for f in saved.files][0].tolist() == [1.0, 2.0]
        return subprocess.CompletedProcess(command, 1, "", "Traceback ...\n" + LAUNCH)

    monkeypatch.delenv("CUDA_LAUNCH_BLOCKING", raising=False)
    monkeypatch.setattr(cuda_fault.subprocess, "run", child)
    line = cuda_fault.describe(RuntimeError(ASYNC), tmp_path / "model.so",
                               [np.array([1.0, 2.0], "float32")])
    assert line == ("CUDA error cudaErrorMisalignedAddress (716): misaligned address in kernel "
                    "fused_conv2d_add_kernel")
    (command, env), = calls
    assert command[1:4] == ["-m", "tvmfuse.cuda_fault", str(tmp_path / "model.so")]
    assert env["CUDA_LAUNCH_BLOCKING"] == "1"
    # where launches are synchronous already, the error itself would have named the kernel
    monkeypatch.setenv("CUDA_LAUNCH_BLOCKING", "1")
    assert cuda_fault.first_failing_kernel(tmp_path / "model.so", []) is None
    assert len(calls) == 1


def test_the_probe_names_the_call_whose_synchronisation_fails(build_tiny, capsys):
    """The child's run, on the CPU: the device's synchronisation after the second kernel
    fails as a faulted kernel's would, and the child names that kernel."""
    _, folder = build_tiny("tiny-transformer")
    deployed = api.load(folder)
    kernels = []
    deployed.vm.set_instrument(lambda _f, symbol, before, *_: kernels.append(symbol)
                               if before and not symbol.startswith("vm.builtin.") else None)
    inputs, _ = deployed.reference()
    arrays = [tvm.runtime.tensor(a, deployed.device) for a in inputs]
    deployed.vm["main"](*arrays)
    assert len(kernels) >= 2

    class Faulting:
        syncs = 0

        def sync(self):
            self.syncs += 1
            if self.syncs == 2:
                raise RuntimeError(ASYNC)

    with pytest.raises(Exception, match="misaligned address"):
        cuda_fault.run_call_by_call(deployed.vm, Faulting(), arrays)
    assert cuda_fault.kernel_named(capsys.readouterr().out) == kernels[1]


class _FaultingVM:
    def __getitem__(self, name):
        def main(*args):
            raise RuntimeError(ASYNC)

        return main


def test_a_build_that_faults_on_the_gpu_is_one_error_naming_the_kernel(monkeypatch, tmp_path):
    monkeypatch.setattr(cuda_fault, "first_failing_kernel",
                        lambda library, arrays: f"{library.name}:fused_softmax_kernel")
    deployed = Deployed(tmp_path, {"library": "model.so"}, (), (), _FaultingVM(), None)
    with pytest.raises(TvmfuseError) as raised:
        deployed.run([])
    assert str(raised.value) == (
        f"{tmp_path / 'model.so'} failed on the GPU: CUDA error cudaErrorMisalignedAddress (716): "
        f"misaligned address in kernel model.so:fused_softmax_kernel; this is a fault of "
        f"tvmfuse's kernel: please report it with the model")


def test_the_cli_reports_a_cuda_error_in_one_line_without_a_traceback(monkeypatch, caplog,
                                                                       capsys):
    def faulting(args):
        raise RuntimeError(LAUNCH)

    monkeypatch.setattr(cli.run, "handle", faulting)
    monkeypatch.setattr(cuda_fault, "LOST", [])
    ended = []  # the process is not ended here: the test runs in it
    monkeypatch.setattr(cli, "_end_if_cuda_context_lost", ended.append)
    with caplog.at_level("INFO"):
        assert cli.main(["run", str(Path("build")), "--random"]) == 2
    errors = [r for r in caplog.records if r.levelname == "ERROR"]
    assert [r.getMessage() for r in errors] == [
        "CUDA error CUDA_ERROR_MISALIGNED_ADDRESS in kernel fused_conv2d_add_kernel"]
    assert errors[0].exc_info is None and "Traceback" not in capsys.readouterr().err
    assert ended == [2] and cuda_fault.LOST == ["CUDA_ERROR_MISALIGNED_ADDRESS"]


_END_AFTER_A_CUDA_ERROR = textwrap.dedent("""
    import atexit
    import sys
    from tvmfuse import cli, cuda_fault
    atexit.register(print, "freed at exit")  # what a lost CUDA context's deleters would do
    if sys.argv[1] == "cuda":
        cuda_fault.describe(RuntimeError("cudaErrorMisalignedAddress (716): misaligned address"))
    sys.exit(cli.main(["run", "no-such-build", "--random"]))
""")


@pytest.mark.parametrize("error", ["cuda", "other"])
def test_after_a_cuda_error_the_cli_ends_without_freeing(error):
    """After a CUDA error, freeing device memory raises inside TVM's deleters, which ended the
    process in std::terminate after the error line (on the H100). The command line then ends
    the process at once with its exit status, nothing freed; after any other error it exits
    as usual."""
    child = subprocess.run([sys.executable, "-c", _END_AFTER_A_CUDA_ERROR, error],
                           capture_output=True, text=True, timeout=120, check=False)
    assert child.returncode == 2, child
    assert ("freed at exit" in child.stdout) == (error == "other"), child
    assert "no-such-build" in child.stderr and "Traceback" not in child.stderr


def _faulting_build(monkeypatch, target):
    """A GEMM whose A is read 4 halves into rows of 72, scheduled as the tensor-core matmul
    did before it checked alignment: 16-byte cp.async copies from addresses 8 bytes off, a
    misaligned address on the GPU whatever the inputs."""
    from tvmfuse.schedules.cuda import matmul  # noqa: PLC0415

    a = te.placeholder((128, 72), "float16", name="A")
    b = te.placeholder((64, 64), "float16", name="B")
    sliced = te.compute((128, 64), lambda i, j: a[i, j + 4], name="slice")
    r = te.reduce_axis((0, 64), "k")
    c = te.compute((128, 64), lambda i, j: te.sum(
        sliced[i, r].astype("float32") * b[r, j].astype("float32"), axis=r), name="matmul")
    out = te.compute((128, 64), lambda i, j: c[i, j].astype("float16"), name="T_cast")
    monkeypatch.setattr(matmul, "_aligned_lanes", lambda block, lanes: lanes)
    sch = matmul.TensorCoreMatmul().apply(te.create_prim_func([a, b, out]),
                                          target.tvm_target(), False)
    kernel = sch.mod["main"].with_attr("tirx.is_scheduled", True).with_attr(
        "global_symbol", "sliced_gemm")
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((128, 72), "float16"))
    w = relax.Var("w", relax.TensorType((64, 64), "float16"))
    with bb.function("main", [x, w]):
        gemm = bb.add_func(kernel, "sliced_gemm")
        y = bb.emit(relax.call_tir(gemm, (x, w), relax.TensorType((128, 64), "float16")))
        bb.emit_func_output(y)
    with tvm.transform.PassContext(opt_level=3, config={"tirx.use_async_copy": True}):
        return tvm.compile(bb.get(), target=target.tvm_target())


#: A process that runs the library and prints the one line ``describe`` makes of its error (a
#: process of its own: a kernel's fault leaves the CUDA context unusable for the tests after it).
#: A user's run of the library as ``tvmfuse run`` makes it (launches asynchronous, one sync at
#: the end, the inputs held until then), then the line it reports, and ends the process without
#: freeing device memory, as the command line does after a CUDA error: on the H100, with its
#: inputs a temporary of the call, the process ended in std::terminate (a tvm::ffi::Error thrown
#: where it cannot be caught: a deleter's cudaFree in the lost context) before any line.
_RUN_AND_DESCRIBE = textwrap.dedent("""
    import os
    import sys
    import numpy as np
    import tvm
    from tvm import relax
    from tvmfuse import cuda_fault
    library, inputs = sys.argv[1:3]
    with np.load(inputs) as saved:
        arrays = [saved[f"arr_{i}"] for i in range(len(saved.files))]
    device = tvm.cuda(0)
    try:
        vm = relax.VirtualMachine(tvm.runtime.load_module(library), device)
        args = [tvm.runtime.tensor(a, device) for a in arrays]
        vm["main"](*args)
        device.sync()
    except Exception as err:
        print(cuda_fault.describe(err, library, arrays), flush=True)
        os._exit(0)
""")


def test_a_kernel_that_faults_on_the_gpu_is_named(monkeypatch, tmp_path):
    """Compiled here (its source has the unaligned 16-byte copies the alignment check finds); on
    a GPU, run: one line, the CUDA error and the kernel."""
    target = api.get_target("cuda-sm90")
    executable = _faulting_build(monkeypatch, target)
    assert {(vec, ptr) for _, vec, ptr, *_ in misaligned(cuda_source(executable))} == {
        ("cp.async 16", "A_ptr")}
    if not tvm.cuda(0).exist:
        pytest.skip("needs a CUDA GPU (run on the GPU host) to run the kernel")
    library, inputs = tmp_path / "model.so", tmp_path / "inputs.npz"
    target.export(executable, str(library))
    np.savez(inputs, np.zeros((128, 72), "float16"), np.zeros((64, 64), "float16"))
    child = subprocess.run([sys.executable, "-c", _RUN_AND_DESCRIBE, str(library), str(inputs)],
                           capture_output=True, text=True, timeout=600, check=False)
    line = child.stdout.strip()
    assert line.startswith("CUDA error ") and "misaligned address" in line.lower(), child
    assert " in kernel sliced_gemm" in line, child

import pytest
from tvm import s_tir, te, tirx

from tvmfuse.schedules.cuda import math_intrinsics
from tvmfuse.targets import get_target

from conftest import cuda_source, nvcc_compiles

TARGET = get_target("cuda-sm90").tvm_target()


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
def test_math_tvm_has_no_cuda_rule_for_compiles_in_cuda(dtype, tmp_path):
    """Every function math_intrinsics lowers (YOSO's acos failed to build: "Unresolved call
    tirx.acos") is CUDA's float or double function; half computes in float."""
    x = te.placeholder((64,), dtype, name="x")

    def every(i):
        value = x[i]
        for name in math_intrinsics.UNARY:
            value = value + getattr(tirx, name)(x[i])
        for name in math_intrinsics.BINARY:
            value = value + getattr(tirx, name)(x[i], value)
        return value

    sch = s_tir.Schedule(te.create_prim_func([x, te.compute((64,), every, name="y")]))
    block_x, thread_x = sch.split(sch.get_loops(sch.get_sblock("y"))[0], [None, 32])
    sch.bind(block_x, "blockIdx.x")
    sch.bind(thread_x, "threadIdx.x")
    source = cuda_source(sch, TARGET)
    suffix = "" if dtype == "float64" else "f"
    for name in (*math_intrinsics.UNARY, *math_intrinsics.BINARY):
        assert f"{name}{suffix}(" in source, name
    nvcc_compiles(source, tmp_path)

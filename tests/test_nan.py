"""NaN in, NaN out: builds keep PyTorch's NaN and +/-Inf (ReLU, ReLU6, max-pooling, softmax and
attention included; :class:`tvmfuse.passes.propagate_nan.PropagateNaN`), and verification fails
an output whose NaN/Inf stand elsewhere than the reference's."""

from __future__ import annotations

import textwrap

import numpy as np
import pytest
import tvm
from tvm import tirx
from tvm.script import tirx as T

from tvmfuse.errors import TvmfuseError
from tvmfuse.passes.propagate_nan import PropagateNaN
from tvmfuse.runtime import load
from tvmfuse.verify import _judge, compare, nonfinite_mismatch, verify_saved

from cuda_collectives import conditional_shuffles


def _lowered(func: tirx.PrimFunc) -> tirx.PrimFunc:
    return PropagateNaN()(tvm.IRModule({"main": func}))["main"]


def test_max_against_a_constant_becomes_a_select_that_keeps_nan():
    @T.prim_func(private=True)
    def before(x: T.Buffer((16,), "float32"), y: T.Buffer((16,), "float32")):
        for i in range(16):
            y[i] = T.min(T.max(x[i], T.float32(0)), T.float32(6))

    @T.prim_func(private=True)
    def after(x: T.Buffer((16,), "float32"), y: T.Buffer((16,), "float32")):
        for i in range(16):
            y[i] = T.Select(T.float32(6) < T.Select(x[i] < T.float32(0), T.float32(0), x[i]),
                            T.float32(6),
                            T.Select(x[i] < T.float32(0), T.float32(0), x[i]))

    tvm.ir.assert_structural_equal(_lowered(before), after)


def test_max_of_two_variables_tests_the_other_for_nan():
    @T.prim_func(private=True)
    def before(x: T.Buffer((16,), "float32"), m: T.Buffer((1,), "float32")):
        for i in range(16):
            m[0] = T.max(m[0], x[i])

    @T.prim_func(private=True)
    def after(x: T.Buffer((16,), "float32"), m: T.Buffer((1,), "float32")):
        for i in range(16):
            m[0] = T.Select(m[0] < x[i] or T.isnan(x[i]), x[i], m[0])

    tvm.ir.assert_structural_equal(_lowered(before), after)


def test_a_warp_shuffle_operand_is_shuffled_once_by_every_lane():
    """The select names its operands up to three times inside ``||`` and ``?:``, which C
    evaluates lazily: a shuffle there is made by some lanes only, and the GPU hangs (the flash
    attention's running maximum did). The shuffle is bound once, before the select."""
    @T.prim_func(private=True)
    def before(m: T.Buffer((1,), "float32")):
        m[0] = T.max(m[0], T.tvm_warp_shuffle_xor(T.uint32(0xFFFFFFFF), m[0], 1, 32, 32))

    store = _lowered(before).body
    let = store.value
    assert isinstance(let, tirx.Let)
    tvm.ir.assert_structural_equal(let.value, before.body.value.b)
    shuffled, m = let.var, store.buffer
    expected = tirx.Select(tirx.Or(m[0] < shuffled, tirx.isnan(shuffled)), shuffled, m[0])
    tvm.ir.assert_structural_equal(let.body, expected)


def test_the_attention_kernel_shuffles_once_per_exchange_in_cuda_source():
    """The flash attention compiled for the H100 (here, no GPU needed): each of its running
    maximum's shuffles stands once in the CUDA C, in a declaration every lane runs, none inside a
    condition."""
    from tvmfuse import api  # noqa: PLC0415
    from tvmfuse.compiler import cuda_source  # noqa: PLC0415

    compiled = api.compile_model(api.import_model("tiny-transformer"), api.get_target("cuda-sm90"),
                                 api.BuildOptions(use_database=False, dtype="float16"))
    source = cuda_source(compiled.executable)
    assert "attention_kernel" in source and "__shfl_xor_sync" in source
    assert conditional_shuffles(source) == []


def test_integer_max_is_left_alone():
    @T.prim_func(private=True)
    def func(x: T.Buffer((16,), "int32"), y: T.Buffer((16,), "float32")):
        for i in range(16):
            y[T.max(i - 1, 0)] = T.Cast("float32", T.max(x[i], 0))

    tvm.ir.assert_structural_equal(_lowered(func), func)


#: Spatial outputs, so that the NaN/Inf pattern is compared element by element: 3x3 convs with
#: ReLU and ReLU6 epilogues, a max-pooling and a softmax over the channels.
POOLS = textwrap.dedent("""
    import torch

    def pools():
        torch.manual_seed(0)
        net = torch.nn.Sequential(
            torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
            torch.nn.Conv2d(16, 16, 3, padding=1), torch.nn.ReLU6(), torch.nn.Softmax(dim=1))
        return net.eval(), (torch.randn(1, 3, 16, 16),)
""")


@pytest.fixture(scope="module")
def pools_source(tmp_path_factory) -> str:
    folder = tmp_path_factory.mktemp("nan")
    (folder / "pools.py").write_text(POOLS)
    return f"{folder / 'pools.py'}:pools"


def _with(arrays: list[np.ndarray], index: int, value: float) -> list[np.ndarray]:
    """``arrays`` with ``value`` placed at two elements of input ``index``."""
    arrays = [a.copy() for a in arrays]
    flat = arrays[index].reshape(-1)
    flat[5] = flat[flat.size // 2 + 7] = value
    return arrays


@pytest.mark.parametrize("model", ["tiny-resnet", "tiny-mobilenet", "tiny-transformer", "pools"])
@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
def test_nan_and_inf_stand_where_pytorch_puts_them(build_tiny, pools_source, model, value):
    imported, folder = build_tiny(pools_source if model == "pools" else model)
    deployed = load(folder)
    placed = range(len(imported.example_inputs))  # the transformer's mask too
    for index in placed:
        arrays = _with(imported.example_inputs, index, value)
        refs = imported.reference(*arrays)
        # a NaN reaches the outputs; an infinity may not (ReLU6 clamps +Inf, a mask of -Inf
        # weighs a key 0), and then the outputs must stay finite
        assert not np.isnan(value) or any(np.isnan(r).any() for r in refs)
        for spec, out, ref in zip(deployed.outputs, deployed.run(arrays), refs):
            assert nonfinite_mismatch(out, ref) is None, (spec.name, index)


def test_verification_fails_an_output_that_loses_a_nan(build_tiny):
    imported, folder = build_tiny("tiny-resnet")
    deployed = load(folder)
    arrays = _with(imported.example_inputs, 0, np.nan)
    refs = imported.reference(*arrays)
    finite = [np.nan_to_num(r) for r in refs]  # a build that drops the NaN
    checks = compare(deployed, finite, refs, "the examples", "pytorch")
    assert not checks[0].ok and "no NaN at 10 of 10 elements" in checks[0].nonfinite

    made_up = [r.copy() for r in imported.reference(*imported.example_inputs)]
    nan_out = [m.copy() for m in made_up]
    nan_out[0][0, 3] = np.nan  # a NaN where the reference is finite
    checks = compare(deployed, nan_out, made_up, "the examples", "pytorch")
    assert "NaN at 1 of 10 elements where the reference is not NaN (the first at (0, 3))" \
        == checks[0].nonfinite


def test_a_nan_pytorch_has_too_in_that_precision_is_named_as_the_models(build_tiny):
    """A small config whose activations vanish in float16 (ALIGN's EfficientNet tower) divides
    zero by zero in PyTorch's float16 as in the build's: the error says the model does not
    compute in that precision, not that tvmfuse lost the reference's NaN."""
    imported, folder = build_tiny("tiny-resnet")
    deployed = load(folder)
    refs = imported.reference(*imported.example_inputs)
    nan_out = [r.copy() for r in refs]
    nan_out[0][0, 3] = np.nan
    peer = nonfinite_mismatch(nan_out[0], refs[0])
    checks = compare(deployed, nan_out, refs, "the examples", "pytorch", "pytorch float16",
                     [0.0], [peer])
    assert not checks[0].ok and checks[0].peer_nonfinite == peer
    with pytest.raises(TvmfuseError, match=r"pytorch float16 has NaN at 1 of 10 elements .*: "
                                           r"the model does not compute in this precision"):
        _judge(checks, "pytorch")
    alone = compare(deployed, nan_out, refs, "the examples", "pytorch", "pytorch float16",
                    [0.0], [None])
    with pytest.raises(TvmfuseError, match="report it as a tvmfuse bug"):
        _judge(alone, "pytorch")


def test_run_check_fails_on_a_nan_the_reference_has_not(build_tiny, monkeypatch):
    _, folder = build_tiny("tiny-resnet")
    deployed = load(folder)
    verify_saved(deployed)  # the build as it is passes
    run = deployed.run

    def with_nan(arrays):
        outs = run(arrays)
        outs[0][0, 0] = np.nan
        return outs

    monkeypatch.setattr(deployed, "run", with_nan)
    with pytest.raises(TvmfuseError, match=r"output \S+ \(the saved inputs\) differs from the "
                                           r"reference saved at build time: NaN at 1 of 10"):
        verify_saved(deployed)

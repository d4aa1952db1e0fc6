"""PartTail (``tvmfuse/passes/part_tail.py``): a register-blocked CPU kernel whose last column
tile writes fewer columns than it computes has its parallel tile loop annotated by the schedule,
and lowering runs that tile's iterations in a loop of their own: the other tiles' stores lose
their predicate (TVM's vectorizer wrote them one element at a time behind it). Checked on the
lowered loops, and on the numbers against PyTorch; kernels whose tiles divide the columns are
left whole."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import tvm
from torch import nn
from tvm import s_tir, tirx

from tvmfuse import api
from tvmfuse.names import PART_TAIL
from tvmfuse.passes import part_tail
from tvmfuse.verify import relative_error

from conftest import HOST


class ChannelsLast(nn.Module):
    """A depthwise conv between NHWC tensors, as it runs in a model after the layout change."""

    def __init__(self, channels: int):
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, padding=1, groups=channels)

    def forward(self, x):
        return self.conv(x.permute(0, 3, 1, 2)).permute(0, 2, 3, 1)


def _scheduled(module: nn.Module, x: torch.Tensor):
    model = api.import_torch(module.eval(), (x,))
    mod, analysis = api.analyze(model, api.get_target(HOST),
                                api.BuildOptions(use_database=False), until="schedule")
    return model, mod, analysis


def _walk(stmt, guarded: bool = False):
    """(statement, whether a branch encloses it) for every statement under ``stmt`` (the loops,
    sequences, branches and blocks between)."""
    yield stmt, guarded
    guarded = guarded or isinstance(stmt, tirx.IfThenElse)
    for field in ("body", "then_case", "else_case", "block"):
        child = getattr(stmt, field, None)
        if isinstance(child, (tirx.Stmt, s_tir.SBlock)):
            yield from _walk(child, guarded)
    for child in getattr(stmt, "seq", ()):
        yield from _walk(child, guarded)


def _statements(stmt):
    return (s for s, _ in _walk(stmt))


def _annotated_loops(func) -> list:
    return [s for s in _statements(func.body)
            if isinstance(s, tirx.For) and PART_TAIL in s.annotations]


def _parallel_loops(func) -> list:
    return [s for s in _statements(func.body)
            if isinstance(s, tirx.For) and s.kind == tirx.ForKind.PARALLEL]


def _kernel(mod: tvm.IRModule, implementation: str, analysis):
    (name,) = [k for k, v in analysis.implementations.items() if v == implementation]
    return mod[name]


def _stores(stmt, buffer: str):
    """(store, whether a branch encloses it) for each store to ``buffer`` under ``stmt``; there
    is at least one (a check over none would pass whatever the lowering did)."""
    stores = [(s, guarded) for s, guarded in _walk(stmt)
              if isinstance(s, tirx.BufferStore) and s.buffer.name == buffer]
    assert stores, f"no store to {buffer}"
    return stores


def _lowered(kernel, split: bool):
    """``kernel``'s blocks lowered and simplified (as the default lowering goes on to do), its
    annotated loop split or not."""
    mod = tvm.IRModule({"k": kernel.with_attr("global_symbol", "k")})
    simplify = tirx.transform.StmtSimplify()
    if split:
        return part_tail.lowering(tvm.transform.Sequential([simplify]))(mod)["k"]
    return tvm.transform.Sequential([*part_tail.lower_blocks(), simplify])(mod)["k"]


def _check_numbers(model, module, x, tmp_path):
    compiled = api.compile_model(model, api.get_target(HOST), api.BuildOptions(use_database=False))
    ours = api.load(api.build(compiled, tmp_path / "out")).run([x.numpy()])[0]
    assert relative_error(ours, module(x).detach().numpy()) < 1e-5


@pytest.mark.parametrize("shape", [(1, 120, 96, 150), (2, 24, 64, 199)])
def test_a_gemm_over_padded_columns_runs_its_last_column_tile_apart(shape, tmp_path):
    batch, rows, depth, columns = shape
    torch.manual_seed(0)
    module, x = nn.Linear(depth, columns), torch.randn(batch, rows, depth)
    model, mod, analysis = _scheduled(module, x)
    kernel = _kernel(mod, "cpu.dense", analysis)
    (loop,) = _annotated_loops(kernel)
    assert loop.kind == tirx.ForKind.PARALLEL
    whole = int(loop.annotations[PART_TAIL])
    assert 0 < whole < int(loop.extent)

    # two parallel loops, the first over the whole column tiles with no branch left (the
    # rows, 120, are whole tiles of every tile's rows, 3 to 10: no padded copy of the input);
    # one loop, every store behind the column predicate, unsplit
    lowered = _lowered(kernel, split=True)
    head, tail = _parallel_loops(lowered)
    assert int(head.extent) == whole and int(tail.extent) == int(loop.extent) - whole
    output = kernel.params[-1].name
    assert not any(guarded for _, guarded in _stores(head, output))
    assert all(guarded for _, guarded in _stores(tail, output))
    assert all(guarded for _, guarded in _stores(_lowered(kernel, split=False).body, output))
    assert not _annotated_loops(lowered)
    _check_numbers(model, module, x, tmp_path)


def test_one_partial_column_tile_stores_its_whole_vectors_apart(tmp_path):
    """77 columns in one tile of 80: the tile's epilogue, not the tile loop, is split."""
    torch.manual_seed(0)
    module, x = nn.Linear(96, 77), torch.randn(1, 48, 96)
    model, mod, analysis = _scheduled(module, x)
    kernel = _kernel(mod, "cpu.dense", analysis)
    (loop,) = _annotated_loops(kernel)
    assert loop.kind != tirx.ForKind.PARALLEL and int(loop.annotations[PART_TAIL]) >= 1
    output = kernel.params[-1].name
    stores = _stores(_lowered(kernel, split=True).body, output)
    assert any(guarded for _, guarded in stores) and not all(guarded for _, guarded in stores)
    assert all(guarded for _, guarded in _stores(_lowered(kernel, split=False).body, output))
    _check_numbers(model, module, x, tmp_path)


def test_a_depthwise_conv_over_padded_channels_runs_its_last_channel_tile_apart(tmp_path):
    torch.manual_seed(0)
    module, x = ChannelsLast(197), torch.randn(1, 12, 12, 197)
    model, mod, analysis = _scheduled(module, x)
    assert _annotated_loops(_kernel(mod, "cpu.depthwise_conv2d", analysis))
    _check_numbers(model, module, x, tmp_path)


def test_a_layer_norm_runs_its_last_partial_group_of_rows_apart_on_one_thread(tmp_path):
    """802 short rows in groups of four (``schedules/cpu/reduction.py``; 45 columns are short
    in vectors of 8 and of 16): 200 whole groups in the parallel loop, whose rows' stores lose
    the predicate, and the last group's two rows in a serial loop of one iteration (a parallel
    loop of one started the thread pool for nothing)."""
    torch.manual_seed(0)
    module, x = nn.LayerNorm(45), torch.randn(1, 802, 45)
    model, mod, analysis = _scheduled(module, x)
    kernel = _kernel(mod, "cpu.row_reduction", analysis)
    (loop,) = _annotated_loops(kernel)
    assert int(loop.annotations[PART_TAIL]) == 200 and loop.kind == tirx.ForKind.PARALLEL
    lowered = _lowered(kernel, split=True)
    (whole,) = _parallel_loops(lowered)
    assert int(whole.extent) == 200
    output = kernel.params[-1].name
    assert not any(guarded for _, guarded in _stores(whole.body, output))
    (tail,) = [s for s in _statements(lowered.body) if isinstance(s, tirx.For)
               and s.loop_var.name == whole.loop_var.name and not s.same_as(whole)]
    assert tail.kind == tirx.ForKind.SERIAL and int(tail.extent) == 1
    assert all(guarded for _, guarded in _stores(tail.body, output))
    _check_numbers(model, module, x, tmp_path)


def test_tiles_that_divide_the_columns_keep_one_loop():
    torch.manual_seed(0)
    _, mod, analysis = _scheduled(nn.Linear(64, 256), torch.randn(1, 50, 64))
    kernel = _kernel(mod, "cpu.dense", analysis)
    assert not _annotated_loops(kernel)
    lowered = part_tail.PartTail(tvm.IRModule({"k": kernel}))["k"]
    tvm.ir.assert_structural_equal(lowered, kernel)


def test_the_split_loops_compute_what_the_whole_loop_computes():
    """The same annotated kernel lowered with and without the split, on the same arguments."""
    torch.manual_seed(0)
    _, mod, analysis = _scheduled(nn.Linear(96, 150), torch.randn(1, 50, 96))
    kernel = _kernel(mod, "cpu.dense", analysis).with_attr("global_symbol", "k")
    target = api.get_target(HOST).tvm_target()
    split = tvm.compile(tvm.IRModule({"k": kernel}), target=target, tir_pipeline="tvmfuse.cpu")
    whole = tvm.compile(tvm.IRModule({"k": kernel}), target=target, tir_pipeline="default")
    rng = np.random.default_rng(0)
    host = [rng.standard_normal([int(d) for d in p.ty.shape]).astype("float32")
            for p in kernel.params]
    outputs = []
    for library in (split, whole):
        args = [tvm.runtime.tensor(a, tvm.cpu()) for a in host]
        library["k"](*args)
        outputs.append(args[-1].numpy())
    np.testing.assert_array_equal(outputs[0], outputs[1])
    assert np.abs(outputs[0]).max() > 0

"""The tensor-core attention kernel (``schedules/cuda/flash_attention.py``): which shapes it
takes, its CUDA source (mma.sync, ldmatrix, warp shuffles; compiled with nvcc here), and on a
machine with an NVIDIA GPU its numbers against NumPy at sequences no tile divides, with queries
and keys of different lengths and masks broadcast along every axis."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import tvm

from tvmfuse import api
from tvmfuse.schedules.cuda import attention, flash_attention
from tvmfuse.shapes import AttentionShape

from conftest import build_cuda_kernel, cuda_source, nvcc_compiles

TARGET = api.get_target("cuda-sm90").tvm_target()
GPU = tvm.cuda(0).exist


def _shape(batch=2, seq=197, heads=3, dim=64, kv_seq=None, dtype="float16", mask=None):
    """Q and K from one packed projection (channel offsets 8 and 8 + H D), V from another, as
    FuseAttention reads them."""
    kv_seq = seq if kv_seq is None else kv_seq
    packed = 3 * heads * dim + 8
    return AttentionShape(batch, seq, heads, dim, q=(packed, 8), k=(packed, 8 + heads * dim),
                          v=(heads * dim, 0), mask=mask or (batch, 1, 1, kv_seq), scale=0.3,
                          dtype=dtype, kv_seq=kv_seq)


@pytest.mark.parametrize("dtype,dim,warps", [("float16", 64, None), ("bfloat16", 128, 4)])
def test_source_has_mma_ldmatrix_shuffles_and_nvcc_compiles_it(tmp_path, dtype, dim, warps):
    """Also at 128-wide heads in 4 warps: Q, K and V tiles of 51 KiB, past the 48 KiB a block
    may declare statically (ptxas refused it before they became dynamic shared memory)."""
    source = cuda_source(flash_attention.flash_attention_kernel(
        _shape(dim=dim, dtype=dtype), warps), TARGET)
    kind = {"float16": "f16", "bfloat16": "bf16"}[dtype]
    assert f"mma.sync.aligned.m16n8k16.row.col.f32.{kind}.{kind}.f32" in source
    assert "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16" in source  # V's B fragments
    assert "ldmatrix.sync.aligned.m8n8.x4.shared.b16" in source
    assert "__shfl_xor_sync" in source
    assert "*(uint4*)(out_ptr" in source  # 16-byte output stores
    nvcc_compiles(source, tmp_path)


def test_which_shapes_it_takes():
    assert flash_attention.supports(_shape())
    assert flash_attention.supports(_shape(seq=1, kv_seq=77, dtype="bfloat16"))
    assert not flash_attention.supports(_shape(dtype="float32"))
    assert not flash_attention.supports(_shape(dim=72))  # heads not a multiple of 16
    assert not flash_attention.supports(_shape(seq=tvm.tirx.Var("seq", "int64")))
    odd = AttentionShape(1, 128, 2, 64, q=(388, 4), k=(388, 132), v=(388, 260),
                         mask=(1, 1, 1, 128), scale=0.125, dtype="float16")
    assert not flash_attention.supports(odd)  # channels not 16-byte aligned
    # the strategy's choice: tensor cores at any batch; float32 and what they cannot take
    # to the SIMT kernel, large float16 attention they cannot take left unfused
    assert attention.attention_kernel(_shape(batch=32)).attrs["tvmfuse.schedule"] \
        == flash_attention.NAME
    assert attention.attention_kernel(_shape(dtype="float32")).attrs["tvmfuse.schedule"] \
        == attention.NAME
    assert attention.attention_kernel(_shape(batch=32, dim=72, seq=512)) is None


def test_warps_fill_the_sms():
    assert flash_attention.choose_warps(_shape(batch=32, seq=128, heads=12)) == 4
    assert flash_attention.choose_warps(_shape(batch=1, seq=128, heads=12)) == 1
    assert flash_attention.choose_warps(_shape(batch=2, seq=197, heads=12)) == 2


@pytest.mark.skipif(not GPU, reason="needs a CUDA GPU (run on the GPU host)")
@pytest.mark.parametrize("seq,kv_seq,dim,mask,warps,dtype", [
    (197, None, 64, None, 4, "float16"),
    (128, None, 64, None, 4, "bfloat16"),
    (7, None, 16, "query", 1, "float16"),
    (50, 77, 80, "head", 2, "float16"),
    (1, 300, 128, None, 1, "float16"),
    (130, None, 128, "query", 4, "bfloat16"),
])
def test_numbers_against_numpy(seq, kv_seq, dim, mask, warps, dtype):
    batch, heads = 2, 3
    kv_seq = seq if kv_seq is None else kv_seq
    mask_shape = {None: (batch, 1, 1, kv_seq), "query": (batch, 1, seq, kv_seq),
                  "head": (1, heads, seq, kv_seq)}[mask]
    shape = _shape(batch, seq, heads, dim, kv_seq, dtype, mask_shape)
    rng = np.random.default_rng(seq * 1000 + kv_seq)
    packed = 3 * heads * dim + 8
    host = ml_dtypes.bfloat16 if dtype == "bfloat16" else np.float16
    q_in = rng.standard_normal((batch, seq, packed)).astype(host)
    k_in = rng.standard_normal((batch, kv_seq, packed)).astype(host)
    v_in = rng.standard_normal((batch, kv_seq, heads * dim)).astype(host)
    masked = rng.random(mask_shape) < 0.3
    masked[..., 0] = False  # every query sees a key
    mask_in = np.where(masked, -1e4, 0).astype(host)
    lib = build_cuda_kernel(flash_attention.flash_attention_kernel(shape, warps), TARGET)
    device = tvm.cuda(0)
    out = tvm.runtime.tensor(np.zeros((batch, seq, heads * dim), host), device)
    lib["main"](*(tvm.runtime.tensor(a, device) for a in (q_in, k_in, v_in, mask_in)), out)

    def heads_of(x, offset, rows):
        part = x[..., offset:offset + heads * dim].astype("float32")
        return part.reshape(batch, rows, heads, dim).transpose(0, 2, 1, 3)

    q, k = heads_of(q_in, 8, seq), heads_of(k_in, 8 + heads * dim, kv_seq)
    v = heads_of(v_in, 0, kv_seq)
    scores = q @ k.transpose(0, 1, 3, 2) * 0.3 + mask_in.astype("float32")
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    want = (probs @ v).transpose(0, 2, 1, 3).reshape(batch, seq, heads * dim)
    got = out.numpy().astype("float32")
    tolerance = 1e-2 if dtype == "bfloat16" else 2e-3
    assert np.linalg.norm(got - want) / np.linalg.norm(want) < tolerance

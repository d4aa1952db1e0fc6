"""Fused multi-head attention for CPUs: ``softmax(Q K^T * scale + mask) V`` in one kernel, with an
online (flash-style) softmax, reading Q, K and V where the projection GEMM wrote them.

This is a kernel, not a schedule rule: attention is a chain of two batched GEMMs around a row
softmax, which no rule over a FuseTIR kernel can turn into one loop nest, so the kernel is written
scheduled, in TensorIR, and :class:`tvmfuse.passes.FuseAttention` calls it in place of the chain.

Per task (batch, head, tile of ``TQ`` query rows; the tile as large as leaves four tasks per
core), on the thread pool, for each tile of ``TK`` keys (one to five vectors: the count that pads
least for its cost, :func:`_key_tile`); neither tile need divide the sequence: rows past its end
are computed from the last row and not written, keys past it score the lowest float and weigh 0,
chosen by ``Select`` (a vector blend): tiles that shrank until they divided the sequence ran
ViT's 197 tokens one key at a time, and an ``if_then_else`` tail is vectorized by TVM as one
branch per lane (``benchmarks/kernel_bench.py attention --sizes 77,197,256``).

1. the keys are transposed into ``kt[D, TK]``, once per task and tile, so that the scores of
   ``R = 4`` rows, ``s[r, :TK] += q[r, d] * kt[d, :TK]``, are vector FMAs with ``q`` broadcast
   and ``kt`` loaded once for the four rows (in passes over D of as many key vectors as the
   registers hold: all of them on AVX-512, two at a time on AVX2);
2. scale and mask are applied; each row's maximum and sum over the tile are vector reductions
   (the tile's vectors folded into one, then halved: no serial chain of scalar max/add); the
   running maximum and sum are rescaled by ``exp(m_old - m_new)`` (the online softmax), with a
   vectorizable polynomial ``exp``;
3. ``o[r, :D] += p[r, j] * v[j, :D]`` for the four rows, ``v`` loaded once for them, in as
   many passes over the tile's keys as keep the rows' outputs in registers
   (:func:`_output_chunk`);
4. after the last tile each row is divided by its sum and written to ``out[b, s, h * D + d]``:
   the heads merged, as the output projection reads them.

The per-row buffers are small ``global``-scope allocations: TVM's CPU lowering keeps those (under
1 KiB) on the stack, where LLVM can hold them in registers, and sends ``local`` ones to its
workspace allocator. BERT-base's 12 layers' attention kernels take a third of the time of the
unfused chain's kernels (two batched matmuls, the scale-mask-softmax kernel, head split and merge
copies; ``tvmfuse inspect bert-base --profile``).

Scores and probabilities never leave the task's stack: per layer of BERT-base that is 12 x 128 x
128 floats (768 KiB) not written and read back twice, and the head split and merge are address
arithmetic instead of copies. ``q``, ``k`` and ``v`` are ``[B, S, C]`` tensors read at channel
offsets (``qo + h * D + d``), so one packed QKV GEMM output serves all three. Arithmetic is in
float32 whatever the storage dtype.
"""

from __future__ import annotations

from tvm import tirx
from tvm.script import tirx as T

from tvmfuse.names import IS_SCHEDULED, SCHEDULE
from tvmfuse.shapes import AttentionShape

#: The name a kernel of this file reports as its implementation.
NAME = "cpu.attention"


def fast_exp(x):
    """``exp(x)`` for float32 ``x`` as TIR arithmetic that vectorizes (TVM's ``topi.fast_exp``:
    ``2^n`` from the exponent bits times a degree-7 polynomial, relative error about 1e-7); LLVM
    turns ``T.exp`` on a vector into one ``expf`` call per lane."""
    x = T.max(T.min(x, T.float32(88.3762626647950)), T.float32(-88.3762626647949))
    n = T.floor(x * T.float32(1.44269504088896341) + T.float32(0.5))
    f = x - n * T.float32(0.6931471805599453)
    poly = T.float32(1.9875691500e-4)
    for c in (1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1,
              5.0000001201e-1):
        poly = poly * f + T.float32(c)
    y = poly * f * f + f + T.float32(1)
    two_n = T.reinterpret("float32", T.shift_left(T.Cast("int32", n + T.float32(127)), 23))
    return two_n * y


def attention_kernel(shape: AttentionShape, lanes: int = 16, cores: int = 1,
                     registers: int = 32) -> tirx.PrimFunc:
    """The scheduled kernel for ``shape``; ``lanes`` is the fp32 vector width (16 on AVX-512),
    ``registers`` the vector registers (32 on AVX-512, 16 on AVX2), ``cores`` the threads it
    should keep busy."""
    B, S, H, D = shape.batch, shape.seq, shape.heads, shape.head_dim  # noqa: N806
    SK = shape.kv_seq  # noqa: N806 - keys: S but in cross-attention and decoding
    (CQ, QO), (CK, KO), (CV, VO) = shape.q, shape.k, shape.v  # noqa: N806
    MB, MH, MQ, MK = shape.mask  # noqa: N806
    # A mask dimension of 1 is broadcast: its index is multiplied by 0.
    fb, fh, fq, fk = (int(not (isinstance(n, int) and n == 1)) for n in (MB, MH, MQ, MK))
    # rows computed together: R x SV scores, R x DW outputs in registers (AVX2: six rows of two
    # vectors, 12 of its 16 registers, faster than four: ``kernel_bench.py attention --sizes
    # 1500``)
    R = 4 if registers >= 32 else 6  # noqa: N806
    TK = _key_tile(SK, lanes, D, registers)  # noqa: N806 - keys per tile: whole vectors of scores
    NK = (SK + TK - 1) // TK  # noqa: N806
    NV = TK // lanes  # noqa: N806 - vectors of scores per row
    SV = min(NV, _score_vectors(registers))  # noqa: N806 - of them, a pass over D
    DW = _output_chunk(D, lanes, registers, R)  # noqa: N806 - output columns a pass over keys
    # Query rows per task: as many as leave four tasks per core (each task transposes its keys
    # once, so larger tiles transpose less), a multiple of R; for a symbolic sequence, a fixed
    # 8 R. Neither tile need divide the sequence (197 = 14 x 14 patches + 1 is prime): past its
    # end, query rows read the last row and are not written, keys read the last key and score
    # the lowest float (weight 0).
    if isinstance(S, int) and isinstance(B, int):
        tasks = 1
        while B * H * tasks < 4 * cores and tasks * R < S:
            tasks += 1
        TQ = R * -(-S // (tasks * R))  # noqa: N806
    else:
        TQ = 8 * R  # noqa: N806
    NQ = (S + TQ - 1) // TQ  # noqa: N806
    last, last_key = S - 1, SK - 1

    def key(kb, jv, jl):
        """The key of lane ``jl`` of vector ``jv`` of key tile ``kb``."""
        return kb * TK + jv * lanes + jl

    def read_key(kb, jv, jl):
        """The key whose K, V and mask entries that lane reads: keys past the end read the last."""
        return T.min(key(kb, jv, jl), last_key)

    scale = float(shape.scale)
    dtype = shape.dtype

    @T.macro
    def fold(buf, op, width):
        """buf[0:width] = op(buf[0:width], buf[width:2 * width]): one vector operation."""
        for lane in T.vectorized(width):
            buf[lane] = op(buf[lane], buf[lane + width])

    @T.macro
    def tree(buf, op):
        """buf[0] = op over buf[0:TK]: the vectors folded into the first, then that vector
        halved each step (no serial chain)."""
        for w in T.unroll(1, NV):
            for lane in T.vectorized(lanes):
                buf[lane] = op(buf[lane], buf[w * lanes + lane])
        if lanes >= 16:
            fold(buf, op, 8)
        if lanes >= 8:
            fold(buf, op, 4)
        if lanes >= 4:
            fold(buf, op, 2)
        fold(buf, op, 1)

    @T.prim_func(private=True)
    def attention(q: T.Buffer((B, S, CQ), dtype), k: T.Buffer((B, SK, CK), dtype),
                  v: T.Buffer((B, SK, CV), dtype), mask: T.Buffer((MB, MH, MQ, MK), dtype),
                  out: T.Buffer((B, S, H * D), dtype)):
        T.func_attr({"tirx.noalias": True, IS_SCHEDULED: True, SCHEDULE: NAME})
        for task in T.parallel(B * H * NQ):
            if True:  # a scope for the task's buffers
                b = task // (H * NQ)
                h = task // NQ % H
                q0 = task % NQ * TQ
                kt = T.decl_buffer((D, NV, lanes), "float32")
                acc = T.decl_buffer((TQ, D), "float32")
                row_max = T.decl_buffer((TQ,), "float32")
                row_sum = T.decl_buffer((TQ,), "float32")
                for i in range(TQ):
                    row_max[i] = T.min_value("float32")  # a masked score is no lower
                    row_sum[i] = T.float32(0)
                    for d in T.vectorized(D):
                        acc[i, d] = T.float32(0)
                for kb in range(NK):
                    for jv, jl, d in T.grid(NV, lanes, D):
                        kt[d, jv, jl] = T.Cast("float32", k[
                            b, read_key(kb, jv, jl), KO + h * D + d])
                    for ib in range(TQ // R):
                        if True:  # registers of R rows
                            i0 = q0 + ib * R
                            s = T.decl_buffer((R, NV, lanes), "float32")
                            o = T.decl_buffer((R, D), "float32")
                            red = T.decl_buffer((TK,), "float32")
                            rescale = T.decl_buffer((R,), "float32")
                            for r in T.unroll(R):
                                for jv in T.unroll(NV):
                                    for jl in T.vectorized(lanes):
                                        s[r, jv, jl] = T.float32(0)
                            for jc in range(NV // SV):  # R x SV scores in registers
                                for d in range(D):
                                    for r in T.unroll(R):
                                        for jv in T.unroll(SV):
                                            for jl in T.vectorized(lanes):
                                                s[r, jc * SV + jv, jl] = s[
                                                    r, jc * SV + jv, jl] + T.Cast("float32", q[
                                                        b, T.min(i0 + r, last), QO + h * D + d]
                                                ) * kt[d, jc * SV + jv, jl]
                            for r in T.unroll(R):
                                # Select, not if_then_else: TVM vectorizes if_then_else as one
                                # branch per lane (the scores of 197 keys ran at under half
                                # 192's speed)
                                for jv in T.unroll(NV):
                                    for jl in T.vectorized(lanes):
                                        s[r, jv, jl] = T.Select(
                                            key(kb, jv, jl) < SK,
                                            s[r, jv, jl] * T.float32(scale) + T.Cast(
                                                "float32", mask[b * fb, h * fh,
                                                                T.min(i0 + r, last) * fq,
                                                                read_key(kb, jv, jl) * fk]),
                                            T.min_value("float32"))
                                # the online softmax: a new maximum rescales what was summed
                                for jv in T.unroll(NV):
                                    for jl in T.vectorized(lanes):
                                        red[jv * lanes + jl] = s[r, jv, jl]
                                tree(red, T.max)
                                red[0] = T.max(red[0], row_max[ib * R + r])
                                rescale[r] = fast_exp(row_max[ib * R + r] - red[0])
                                row_max[ib * R + r] = red[0]
                                for jv in T.unroll(NV):
                                    for jl in T.vectorized(lanes):
                                        # keys past the end weigh 0; the maximum is read
                                        # from row_max: red[0] is written by the first vector
                                        s[r, jv, jl] = T.Select(
                                            key(kb, jv, jl) < SK,
                                            fast_exp(s[r, jv, jl] - row_max[ib * R + r]),
                                            T.float32(0))
                                        red[jv * lanes + jl] = s[r, jv, jl]
                                tree(red, T.Add)
                                row_sum[ib * R + r] = row_sum[ib * R + r] * rescale[r] + red[0]
                                for d in T.vectorized(D):
                                    o[r, d] = acc[ib * R + r, d] * rescale[r]
                            for dc in range(D // DW):  # R x DW outputs in registers
                                for jv, jl in T.grid(NV, lanes):
                                    for r in T.unroll(R):
                                        for d in T.vectorized(DW):
                                            o[r, dc * DW + d] = o[r, dc * DW + d] + s[
                                                r, jv, jl] * T.Cast("float32", v[
                                                    b, read_key(kb, jv, jl),
                                                    VO + h * D + dc * DW + d])
                            for r in T.unroll(R):
                                for d in T.vectorized(D):
                                    acc[ib * R + r, d] = o[r, d]
                for i in range(TQ):
                    if q0 + i < S:
                        for d in T.vectorized(D):
                            # a row whose keys are all masked with -inf sums to 0: it gets
                            # 0, as PyTorch's scaled_dot_product_attention gives it; a row
                            # that met a NaN sums to NaN and stays NaN (not ``sum > 0``)
                            out[b, q0 + i, h * D + d] = T.Cast(dtype, T.Select(
                                row_sum[i] == T.float32(0), T.float32(0),
                                acc[i, d] / row_sum[i]))

    return attention


def _score_vectors(registers: int) -> int:
    """Key vectors whose scores one pass over the head computes: AVX-512's 32 registers hold
    four rows of five (20 accumulators, five key vectors and a broadcast: 26), AVX2's 16 six
    rows of two (15)."""
    return 5 if registers >= 32 else 2


def _key_tile(seq, lanes: int, head_dim: int = 64, registers: int = 32) -> int:
    """Keys per tile: a whole number of vectors, up to five or a pass's worth
    (:func:`_score_vectors`), or more whole passes while the transposed keys fit 16 KiB (AVX2:
    two, four, six or eight vectors), the one that costs least by a count of vector operations
    per query row: each padded key costs its multiply-adds (``2 * head_dim / lanes``) and its
    ``exp`` (about 16 operations a vector of keys), each tile the rescale of the row's output (a
    load, a multiply and a store a vector of it) and about 8 more (the two reductions, the
    bookkeeping). 77 keys on AVX-512: one tile of 80 (not three of 32 = 96); 197: seven of
    32, 2156 operations, against 2384 for four of 64. On AVX2 the tile's share is larger (eight
    vectors of output a row where AVX-512 has four): Whisper's 1500 tokens run faster in tiles of
    64 keys than of 32 (``kernel_bench.py attention --sizes 1500``). At least two vectors past one
    vector's keys: four rows of one vector are four chains of dependent multiply-adds, too few to
    fill two FMA pipes of latency 4. Four vectors for a symbolic sequence."""
    if not isinstance(seq, int):
        return 4 * lanes
    if seq <= lanes:
        return lanes
    per_key = (2 * head_dim + 16) / lanes
    per_tile = 8 + 3 * head_dim / lanes

    def cost(tile):
        tiles = -(-seq // tile)
        return tiles * (tile * per_key + per_tile)

    per_pass = _score_vectors(registers)
    counts = [n for n in range(2, 5 * per_pass + 1)
              if n <= per_pass or (n % per_pass == 0 and n * lanes * head_dim <= 4096)]
    return min((n * lanes for n in counts), key=lambda tile: (cost(tile), -tile))


def _output_chunk(head_dim: int, lanes: int, registers: int, rows: int) -> int:
    """Output columns computed in one pass over a key tile: the most whole vectors of a head,
    dividing it, whose ``rows`` rows fit the vector registers with four to spare (the value
    vectors and a broadcast). AVX-512's 32 registers hold four rows of a 64-wide head (16
    accumulators); AVX2's 16 hold two of its eight vectors for six rows: in one pass its
    accumulators lived on the stack, each multiply-add a load and a store (12 heads of 64 at
    1500 tokens run a quarter faster in passes of two vectors). A head that is not whole vectors
    is one pass."""
    if head_dim % lanes:
        return head_dim
    vectors, most = head_dim // lanes, max(1, (registers - 4) // rows)
    return lanes * max(n for n in range(1, min(most, vectors) + 1) if vectors % n == 0)

"""``--dynamic seq``: one build runs every sequence length up to ``--max-seq``, its kernels
scheduled for the symbolic length (attention fused, GEMMs on register tiles over padded rows),
verified at several lengths against PyTorch; lengths past the bound are a clear error."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tvmfuse import TvmfuseError, api
from tvmfuse.verify import verify

from conftest import HOST

TARGET = api.get_target(HOST)


@pytest.fixture(scope="module")
def distilbert(tmp_path_factory):
    """DistilBERT (small config) with a symbolic batch and sequence, up to 64 tokens."""
    model = api.import_model("tiny-distilbert", dynamic=["batch", "seq"], max_seq=64)
    compiled = api.compile_model(model, TARGET, api.BuildOptions(use_database=False))
    return model, compiled, api.load(api.build(compiled, tmp_path_factory.mktemp("d") / "out"))


def test_kernels_are_scheduled_for_the_symbolic_length(distilbert):
    _, compiled, deployed = distilbert
    rules = {g.rule for g in compiled.analysis.groups}
    assert {"tvmfuse.fused_attention", "tvmfuse.layer_norm_epilogue.bias_add"} <= rules
    implementations = compiled.analysis.implementations
    assert "default" not in implementations.values()
    assert sum(i == "cpu.attention" for i in implementations.values()) == 1  # one per shape
    # the GEMM + LayerNorm keeps DenseRowNorm where one register tile spans the 64 columns
    # (AVX-512); over several column tiles (AVX2, SSE) that rule declines a symbolic row count,
    # whose rows it normalized before all their columns were written
    from tvm import tirx

    from tvmfuse.schedules.cpu.dense import _one_column_tile

    row_norm = _one_column_tile(tirx.IntImm("int64", 64), TARGET.vector)
    assert "cpu.dense" in implementations.values()
    assert ("cpu.dense_row_norm" in implementations.values()) == row_norm
    assert deployed.manifest["bounds"] == {"seq": 64}
    assert deployed.inputs[0].shape == ("batch", "seq")


def test_verify_checks_several_lengths_and_batches(distilbert):
    model, _, deployed = distilbert
    checks = verify(deployed, model)
    assert [c.at for c in checks] == ["batch 1, seq 50", "batch 2, seq 50", "batch 1, seq 19",
                                      "batch 1, seq 64"]
    assert max(c.rel_err for c in checks) < 1e-5


@pytest.mark.parametrize("length", [1, 2, 33])
def test_any_length_up_to_the_bound_matches_pytorch(distilbert, length):
    model, _, deployed = distilbert
    arrays = model.inputs_at({"batch": 1, "seq": length})
    (out,) = deployed.run(arrays)
    (ref,) = model.reference(*arrays)
    assert out.shape == (1, length, 64)
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4)


def test_a_length_past_the_bound_or_lengths_that_disagree_are_errors(distilbert):
    model, _, deployed = distilbert
    ids, mask = model.inputs_at({"batch": 1, "seq": 65})
    with pytest.raises(TvmfuseError, match=r"input 'input_ids' has seq 65; this build runs seq "
                                           r"up to 64 \(rebuild it with --max-seq 65\)"):
        deployed.run([ids, mask])
    ids, mask = model.inputs_at({"batch": 1, "seq": 20})
    with pytest.raises(TvmfuseError, match="have seq 20 and 19; they share one seq"):
        deployed.run([ids, mask[:, :19]])


class CausalLM(torch.nn.Module):
    """GPT-2 (small config) as ids -> logits, its causal mask sliced to the length."""

    def __init__(self):
        super().__init__()
        import transformers

        config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=1000,
                                         n_positions=128)
        torch.manual_seed(0)
        self.model = transformers.GPT2LMHeadModel(config).eval()

    def forward(self, input_ids):
        return self.model(input_ids=input_ids, use_cache=False).logits


def test_a_causal_decoder_builds_once_for_every_length(tmp_path):
    ids = torch.randint(0, 1000, (1, 40), generator=torch.Generator().manual_seed(0))
    model = api.import_torch(CausalLM(), [ids], dynamic=["seq"], max_seq=96)
    compiled = api.compile_model(model, TARGET, api.BuildOptions(use_database=False))
    assert "tvmfuse.fused_attention" in {g.rule for g in compiled.analysis.groups}
    checks = verify(api.load(api.build(compiled, tmp_path / "out")), model)
    assert [c.at for c in checks] == ["seq 40", "seq 31", "seq 96"]
    assert max(c.rel_err for c in checks) < 1e-5

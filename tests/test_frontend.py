import textwrap

import numpy as np
import pytest
import torch
import tvm
from tvm import relax, tirx

from tvmfuse import TvmfuseError, zoo
from tvmfuse.frontend import import_model
from tvmfuse.specs import TensorSpec, parse_shape, random_inputs

from conftest import HOST


def test_parse_shape():
    assert parse_shape("1,3,224,224") == ((1, 3, 224, 224), None)
    assert parse_shape("1x128:int64") == ((1, 128), "int64")
    for bad in ("", "1,a", "1,-3", "1,2:float99"):
        with pytest.raises(TvmfuseError):
            parse_shape(bad)


def test_tensor_spec_check_accepts_symbolic_dims_and_names_the_input():
    spec = TensorSpec("x", ("batch", 3), "float32")
    spec.check(np.zeros((5, 3), "float32"))
    with pytest.raises(TvmfuseError, match=r"input 'x' has shape \(5, 4\).*\(batch, 3\)"):
        spec.check(np.zeros((5, 4), "float32"))
    with pytest.raises(TvmfuseError, match="input 'x' has dtype float64"):
        spec.check(np.zeros((5, 3)))


def test_random_inputs_are_seeded_and_respect_integer_ranges():
    specs = [TensorSpec("ids", (2, 64), "int64"), TensorSpec("x", ("batch", 4), "float32")]
    a, b = random_inputs(specs, {"ids": (0, 7)}), random_inputs(specs, {"ids": (0, 7)})
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert a[0].min() >= 0 and a[0].max() < 7 and a[0].dtype == np.int64
    assert a[1].shape == (1, 4)


def test_zoo_models_build_offline_and_deterministically(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    for name in ("tiny-resnet", "tiny-mobilenet", "tiny-transformer", "mobilenet_v2"):
        entry = zoo.get(name)
        first, second = entry.build(), entry.build()
        w1, w2 = next(iter(first.state_dict().values())), next(iter(second.state_dict().values()))
        assert torch.equal(w1, w2), name
        for bn in (m for m in first.modules() if isinstance(m, torch.nn.BatchNorm2d)):
            assert not torch.allclose(bn.running_var, torch.ones_like(bn.running_var))


def test_unknown_model_lists_the_zoo():
    with pytest.raises(TvmfuseError, match="unknown model 'resnet51'.*resnet50.*bert-base"):
        import_model("resnet51")


def test_zoo_import_yields_relax_with_specs_and_reference():
    model = import_model("tiny-resnet")
    assert isinstance(model.mod["main"], relax.Function)
    assert model.inputs == (TensorSpec("x", (1, 3, 32, 32), "float32"),)
    assert model.outputs == (TensorSpec("output0", (1, 10), "float32"),)
    (ref,) = model.reference(*model.example_inputs)
    assert ref.shape == (1, 10)


def test_dynamic_batch_stays_symbolic_in_relax():
    model = import_model("tiny-transformer", dynamic=["batch"])
    params = model.mod["main"].params
    for param in params:
        assert isinstance(param.ty.shape.values[0], tirx.Var)
    assert params[0].ty.shape.values[0].same_as(params[1].ty.shape.values[0])
    assert [s.shape[0] for s in model.inputs] == ["batch", "batch"]
    assert model.outputs[0].shape == ("batch", 16, 64)


def test_unknown_dynamic_dim_is_an_error():
    with pytest.raises(TvmfuseError, match="unknown dynamic dimension 'time'"):
        import_model("tiny-resnet", dynamic=["time"])


def test_dynamic_seq_is_axis_1_of_the_token_inputs_bounded_by_max_seq():
    model = import_model("tiny-distilbert", dynamic=["seq"], max_seq=96)
    assert [s.shape for s in model.inputs] == [(1, "seq"), (1, "seq")]
    assert model.outputs[0].shape == (1, "seq", 64)
    main = model.mod["main"]
    seq = main.params[0].ty.shape.values[1]
    assert isinstance(seq, tirx.Var) and seq.same_as(main.params[1].ty.shape.values[1])
    assert int(main.attrs["tir_var_upper_bound"][seq.name]) == 96
    assert model.bounds == {"seq": 96}
    # inputs at another length are drawn as the examples were: ids across the vocabulary
    ids, mask = model.inputs_at({"seq": 70})
    assert ids.shape == mask.shape == (1, 70) and ids.max() > 100


@pytest.mark.parametrize(("source", "options", "message"), [
    ("tiny-t5", {"max_seq": 96}, r"differ on axis 1 \(input_ids 61, decoder_input_ids 13\)"),
    ("tiny-vit", {"max_seq": 96}, "has no token inputs"),
    ("tiny-distilbert", {"max_seq": 32}, "the example length 50 is not within 2..32"),
    ("tiny-distilbert", {}, "needs --max-seq N"),
])
def test_dynamic_seq_errors_name_what_to_change(source, options, message):
    with pytest.raises(TvmfuseError, match=message):
        import_model(source, dynamic=["seq"], **options)


def test_wrong_input_shape_is_one_clear_error():
    with pytest.raises(TvmfuseError, match=r"tiny-resnet cannot run on inputs x\(1, 4, 32, 32\)"):
        import_model("tiny-resnet", input_shapes=["1,4,32,32"])
    with pytest.raises(TvmfuseError, match="takes 1 input"):
        import_model("tiny-resnet", input_shapes=["1,3,32,32", "1,3"])


def _write_factory(tmp_path, body: str):
    path = tmp_path / "mymodels.py"
    path.write_text(textwrap.dedent(body))
    return path


def _compiled(model):
    """``model`` compiled for this CPU (untuned rules' schedules and the default options)."""
    from tvmfuse import api

    return api.compile_model(model, api.get_target(HOST), api.BuildOptions())


def _verified(model, folder, compiled=None) -> list:
    """``compiled`` (or ``model`` compiled) built into ``folder`` and verified against the
    model's reference: the checks."""
    from tvmfuse import api
    from tvmfuse.verify import verify

    return verify(api.load(api.build(compiled or _compiled(model), folder)), model)


def _onnx_model(graph, path, opset: int = 17):
    """The ONNX ``graph`` saved to ``path`` at ``opset`` and imported."""
    import onnx
    from onnx import helper

    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)]), str(path))
    return import_model(str(path))


def test_factory_from_file_with_example_inputs(tmp_path):
    path = _write_factory(tmp_path, """
        import torch

        class Gate(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = torch.nn.Linear(8, 8)

            def forward(self, tokens):
                return torch.sigmoid(self.fc(tokens)) * tokens

        def make():
            return Gate(), (torch.randn(2, 8),)
    """)
    model = import_model(f"{path}:make")
    assert model.kind == "factory"
    assert model.inputs == (TensorSpec("tokens", (2, 8), "float32"),)
    resized = import_model(f"{path}:make", input_shapes=["3,8"])
    assert resized.example_inputs[0].shape == (3, 8)


def test_factory_from_package_module_needs_shapes_without_examples(tmp_path, monkeypatch):
    _write_factory(tmp_path, """
        import torch

        def make():
            return torch.nn.Sequential(torch.nn.Linear(4, 2), torch.nn.ReLU())
    """)
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(TvmfuseError, match="no example inputs; pass --input-shape"):
        import_model("mymodels:make")
    model = import_model("mymodels:make", input_shapes=["5,4"])
    assert model.outputs[0].shape == (5, 2)


def test_token_ids_are_drawn_below_the_embedding_size(tmp_path):
    """Without examples, integer inputs used to be drawn in (0, 2): two rows of a 500-token
    embedding. An input that indexes an embedding is drawn below its size; one that does not
    (a mask) keeps (0, 2)."""
    path = _write_factory(tmp_path, """
        import torch

        class Tagger(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.embed = torch.nn.Embedding(500, 8)

            def forward(self, input_ids, mask):
                return self.embed(input_ids) * mask[..., None]

        def make():
            return Tagger()
    """)
    model = import_model(f"{path}:make", input_shapes=["1,64:int64", "1,64:int64"])
    ids, mask = model.example_inputs
    assert 100 < ids.max() < 500 and ids.min() >= 0
    assert set(np.unique(mask)) <= {0, 1}


def test_integer_examples_from_a_factory_bound_the_drawn_inputs(tmp_path):
    path = _write_factory(tmp_path, """
        import torch

        class Lookup(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.table = torch.nn.Parameter(torch.randn(40, 4))

            def forward(self, index):
                return self.table[index]

        def make():
            return Lookup(), (torch.arange(10, 40).reshape(1, 30),)
    """)
    (index,) = import_model(f"{path}:make", input_shapes=["1,300:int64"]).example_inputs
    assert index.min() >= 10 and index.max() <= 39 and len(np.unique(index)) > 20


def test_gpt2_with_its_default_cache_imports_and_verifies(tmp_path):
    """transformers' cache starts each layer from torch.tensor([]) and concatenates the keys
    onto it; TVM's importer refused that ("Concat expects all input tensors to have same
    ndim")."""
    path = _write_factory(tmp_path, """
        import torch
        import transformers

        class WithCache(torch.nn.Module):
            def __init__(self):
                super().__init__()
                config = transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=300)
                self.lm = transformers.GPT2LMHeadModel(config)

            def forward(self, input_ids):
                out = self.lm(input_ids=input_ids)  # use_cache defaults to True
                return out.logits, out.past_key_values.layers[0].keys

        def make():
            return WithCache(), (torch.randint(0, 300, (1, 11)),)
    """)

    model = import_model(f"{path}:make")
    checks = _verified(model, tmp_path / "out")
    assert len(checks) == 2 and max(c.rel_err for c in checks) < 1e-4


def test_a_mixture_of_experts_model_imports_and_verifies(tmp_path):
    """transformers routes tokens to experts through histc and a custom grouped-matmul op by
    default, which TVM cannot import; the export takes its batched-matmul implementation and
    the module is left as it was."""
    import transformers

    from tvmfuse.frontend import _import_torch

    config = transformers.MixtralConfig(hidden_size=64, intermediate_size=48, num_hidden_layers=1,
                                        num_attention_heads=4, num_key_value_heads=2,
                                        num_local_experts=5, num_experts_per_tok=2,
                                        vocab_size=101, use_cache=False)
    torch.manual_seed(0)
    module = transformers.MixtralModel(config).eval()
    assert module.get_experts_implementation() == {"": "grouped_mm"}
    model = _import_torch("mixtral", "factory", module,
                          (TensorSpec("input_ids", (1, 13), "int64"),), {}, ())
    assert module.get_experts_implementation() == {"": "grouped_mm"}
    assert "R.take" in model.mod["main"].script()  # each token's experts' weights, gathered
    checks = _verified(model, tmp_path / "out")
    assert max(c.rel_err for c in checks) < 1e-4


def test_an_empty_tensor_in_a_concat_is_dropped(tmp_path):
    """DINOv3 concatenates zero register tokens, ``[1, 0, 64]``: kept, it became a constant of
    no elements that TVM's loader refused ("Invalid DLTensor file format")."""
    from tvmfuse import api

    class Tokens(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.cls = torch.nn.Parameter(torch.randn(1, 1, 8))
            self.registers = torch.nn.Parameter(torch.zeros(1, 0, 8))

        def forward(self, x):
            return torch.cat([self.cls, self.registers, x], dim=1).softmax(-1)

    model = api.import_torch(Tokens().eval(), (torch.randn(1, 5, 8),))
    assert "R.concat" in model.mod["main"].script() and "(1, 0, 8)" not in model.mod.script()
    checks = _verified(model, tmp_path / "out")
    assert max(c.rel_err for c in checks) < 1e-6


def test_a_concat_of_mixed_dtypes_is_promoted_as_pytorch_does(tmp_path):
    """FLAVA concatenates float32 embeddings with int64 ones: PyTorch promotes, TVM's importer
    refused ("Concat expects all input tensors to have the same dtype")."""
    from tvmfuse import api

    class Mixed(torch.nn.Module):
        def forward(self, x, ids):
            return torch.cat([x, ids], dim=-1) * 0.5

    model = api.import_torch(Mixed(), (torch.randn(2, 5), torch.arange(6).reshape(2, 3)))
    checks = _verified(model, tmp_path / "out")
    assert max(c.rel_err for c in checks) < 1e-6


def test_an_unsorted_topk_imports_as_a_sorted_one(tmp_path):
    """A mixture-of-experts router's ``topk(..., sorted=False)`` (ERGO): TVM's importer takes
    only sorted ones; PyTorch leaves the unsorted order to the implementation."""
    from tvmfuse import api

    class Router(torch.nn.Module):
        def forward(self, x):
            weights, experts = torch.topk(x.softmax(-1), 3, dim=-1, sorted=False)
            return (weights * experts.float()).sum(-1)  # the same for any order of the three

    x = torch.randn(5, 9)
    torch.onnx.export(Router(), (x,), str(tmp_path / "router.onnx"), dynamo=False,
                      input_names=["x"])
    onnx = pytest.importorskip("onnx")
    topk = [n for n in onnx.load(str(tmp_path / "router.onnx")).graph.node if n.op_type == "TopK"]
    assert [a.i for a in topk[0].attribute if a.name == "sorted"] == [0]
    for source in (api.import_torch(Router(), (x,)), import_model(str(tmp_path / "router.onnx"))):
        checks = _verified(source, tmp_path / source.kind)
        assert max(c.rel_err for c in checks) < 1e-6


@pytest.mark.parametrize("index", [
    lambda x, a, b, c: x[:, :, a, b],  # ConvBERT's unfold: indexed axes adjacent, after slices
    lambda x, a, b, c: x[:, a, :, b],  # apart: their dimensions lead
    lambda x, a, b, c: x[:, :, a, c],
    lambda x, a, b, c: x[a, :, b],
], ids=["after-slices", "apart", "broadcast", "apart-from-zero"])
def test_indexing_after_slices_places_dimensions_as_pytorch_does(tmp_path, index):
    """``x[:, :, rows, cols]``: TVM's importer broadcast an ``arange`` for each slice against the
    index tensors ("cannot broadcast index shapes ... 32 vs 9" for ConvBERT)."""
    from tvmfuse import api

    class Index(torch.nn.Module):
        def forward(self, x):
            a = torch.arange(9).reshape(9, 1, 1) % 4
            b = torch.arange(8).reshape(1, 8, 1) % 3
            return index(x, a, b, torch.tensor([[1, 0, 2]])) * 2.0

    model = api.import_torch(Index(), (torch.randn(4, 5, 4, 3),))
    checks = _verified(model, tmp_path / "out")
    assert max(c.rel_err for c in checks) < 1e-6


def test_fourier_transforms_import_as_dft_matrix_products(tmp_path):
    """FNet mixes tokens with ``torch.fft.fftn(x).real``: complex tensors, which Relax has no
    dtype for, and ``_fft_c2c``/``_fft_r2c``, which TVM's importer has no converter for. Forward,
    inverse, normalized and one-sided transforms against PyTorch's."""
    from tvmfuse import api

    class Fourier(torch.nn.Module):
        def forward(self, x):
            return (torch.fft.fftn(x.to(torch.complex64), dim=(-2, -1)).real,
                    torch.fft.fft(x, dim=1, norm="ortho").imag,
                    torch.fft.ifft(torch.fft.fft(x, dim=-1), dim=-1, norm="forward").real,
                    torch.view_as_real(torch.fft.rfft(x, dim=-1)))

    model = api.import_torch(Fourier(), (torch.randn(2, 8, 12),))
    checks = _verified(model, tmp_path / "out")
    assert len(checks) == 4 and max(c.rel_err for c in checks) < 1e-5


def test_a_rotary_embedding_in_complex_numbers_imports(tmp_path):
    """DeepSeek-V2 rotates queries and keys as complex numbers: ``polar`` frequencies,
    ``view_as_complex``, a complex product (and one by a real scalar), views of complex tensors,
    ``view_as_real``."""
    from tvmfuse import api

    class Rotary(torch.nn.Module):
        def forward(self, q, freqs):
            cis = torch.polar(torch.ones_like(freqs), freqs) * 1.0
            z = torch.view_as_complex(q.float().view(*q.shape[:-1], -1, 2))
            return (torch.view_as_real(z * cis.unsqueeze(1)).flatten(3),
                    torch.view_as_real(2.0 * z.transpose(1, 2)))

    model = api.import_torch(Rotary(), (torch.randn(1, 4, 8, 16), torch.randn(1, 8, 8)))
    checks = _verified(model, tmp_path / "out")
    assert len(checks) == 2 and max(c.rel_err for c in checks) < 1e-6


def test_an_onnx_constant_of_the_empty_shape_is_a_scalar(tmp_path):
    """GIT's ``new_zeros(())`` exports as ConstantOfShape of an empty shape, a scalar, which
    TVM's ONNX frontend refused ("the given tensor has ndim 1 while the target shape has ndim
    0")."""
    pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper


    graph = helper.make_graph(
        [helper.make_node("ConstantOfShape", ["shape"], ["c"],
                          value=numpy_helper.from_array(np.array([2.5], "float32"))),
         helper.make_node("Add", ["x", "c"], ["y"])],
        "scalar", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
        [numpy_helper.from_array(np.zeros(0, "int64"), "shape")])
    model = _onnx_model(graph, tmp_path / "scalar.onnx")
    checks = _verified(model, tmp_path / "out")
    assert max(c.rel_err for c in checks) < 1e-6


@pytest.mark.parametrize("equation,shapes", [
    ("bhlk,bhtk->bhlt", [(1, 2, 6, 4), (1, 2, 5, 4)]),  # CvT's attention scores
    ("bhlt,bhtv->bhlv", [(1, 2, 6, 5), (1, 2, 5, 3)]),
    ("bij,jk->bik", [(2, 3, 4), (4, 5)]),
    ("abc,cd->dba", [(2, 3, 4), (4, 5)]),  # the product's axes permuted
    ("ii->i", [(4, 4)]),  # a diagonal: not a product, TVM's einsum kernel
])
def test_an_onnx_einsum_that_is_a_matrix_product_is_a_matmul(tmp_path, equation, shapes):
    """TVM's ONNX frontend made each Einsum one generic kernel no GEMM rule takes (CvT's took
    LLVM minutes to compile); as matmuls, the GEMM rules schedule them."""
    pytest.importorskip("onnx")
    from onnx import TensorProto, helper


    names = ["a", "b"][:len(shapes)]
    graph = helper.make_graph(
        [helper.make_node("Einsum", names, ["y"], equation=equation)], "einsum",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in zip(names, shapes)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = _onnx_model(graph, tmp_path / "einsum.onnx")
    compiled = _compiled(model)
    kernels = " ".join(compiled.analysis.kernels)
    assert ("einsum" in kernels) == (len(shapes) == 1) and ("matmul" in kernels) != \
        (len(shapes) == 1)
    checks = _verified(model, tmp_path / "out", compiled)
    assert max(c.rel_err for c in checks) < 1e-6


def test_division_with_a_rounding_mode_computes_in_pytorchs_dtype(tmp_path):
    """``torch.div(t, n, rounding_mode=...)`` by a Python number: TVM's importer made ``n`` an
    int32 or float32 constant whatever ``t``'s dtype (Llama 4's int64 positions floor-divided
    by 8192, Mask2Former's float32 sizes by 2: "Binary operators must have the same
    datatype")."""
    from tvmfuse import api

    class Divide(torch.nn.Module):
        def forward(self, pos, x):
            return (torch.div(pos, 3, rounding_mode="floor"),
                    torch.div(-pos, 4, rounding_mode="trunc"),
                    torch.div(-pos, 4, rounding_mode="floor"),
                    torch.div(x, 2, rounding_mode="floor"), torch.div(x, 2, rounding_mode="trunc"),
                    torch.div(x, pos.float(), rounding_mode="floor"))

    model = api.import_torch(Divide(), (torch.arange(1, 11).reshape(1, 10),
                                        torch.randn(1, 10) * 10))
    checks = _verified(model, tmp_path / "out")
    assert len(checks) == 6 and max(c.rel_err for c in checks) < 1e-6


def test_grid_sample_reads_pytorchs_grid_layout(tmp_path):
    """``F.grid_sample`` takes its grid as ``[N, H_out, W_out, 2]``, TVM's op as ``[N, 2, H_out,
    W_out]``: imported as it was, the output had the wrong shape (Mask2Former's deformable
    attention did not import). Bilinear, nearest, border and reflection padding."""
    import torch.nn.functional as F

    from tvmfuse import api

    class Sample(torch.nn.Module):
        def forward(self, x, grid):
            return (F.grid_sample(x, grid, align_corners=False),
                    F.grid_sample(x, grid, mode="nearest", padding_mode="border",
                                  align_corners=True),
                    F.grid_sample(x, grid, padding_mode="reflection", align_corners=False))

    model = api.import_torch(Sample(), (torch.randn(2, 3, 5, 7),
                                        torch.rand(2, 4, 6, 2) * 2.4 - 1.2))
    checks = _verified(model, tmp_path / "out")
    assert len(checks) == 3 and max(c.rel_err for c in checks) < 1e-5


def test_a_masked_assignment_of_one_value_is_a_select(tmp_path):
    """``ids[mask] = 0`` (Granite Speech's audio tokens), a mask over all axes and over the
    leading ones: TVM's importer took integer indices only."""
    from tvmfuse import api

    class Blank(torch.nn.Module):
        def forward(self, ids, x):
            ids, x = ids.clone(), x.clone()
            ids[ids > 5] = 0
            x[x[..., 0] > 0] = -1.0
            return ids, x

    model = api.import_torch(Blank(), (torch.randint(0, 10, (2, 8)), torch.randn(2, 8, 3)))
    checks = _verified(model, tmp_path / "out")
    assert len(checks) == 2 and max(c.rel_err for c in checks) == 0


def test_an_onnx_unsqueeze_of_scalar_axes_imports(tmp_path):
    """GLM-ASR's encoder gives Unsqueeze its axes as a scalar initializer (ONNX Runtime takes
    it); TVM's frontend iterated them ("'int' object is not iterable")."""
    pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper


    graph = helper.make_graph(
        [helper.make_node("Unsqueeze", ["x", "axes"], ["u"]),
         helper.make_node("Mul", ["u", "u"], ["y"])],
        "unsqueeze", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3, 1])],
        [numpy_helper.from_array(np.array(2, "int64"), "axes")])
    model = _onnx_model(graph, tmp_path / "unsqueeze.onnx")
    checks = _verified(model, tmp_path / "out")
    assert max(c.rel_err for c in checks) < 1e-6


@pytest.mark.parametrize("opset,attributes,last", [
    (20, {}, 1),  # FNet's: a real input, the axis an input
    (20, {"inverse": 1}, 2),  # a complex input, inverse
    (17, {"axis": 2, "onesided": 1}, 1),  # the axis an attribute, one-sided
])
def test_an_onnx_dft_imports_as_matrix_products(tmp_path, opset, attributes, last):
    """TVM's ONNX frontend has no DFT (FNet's ONNX export); against ONNX Runtime."""
    pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper


    inputs, initializers = ["x", ""], []
    if opset >= 20:
        inputs.append("axis")
        initializers.append(numpy_helper.from_array(np.array(-2, "int64"), "axis"))
    graph = helper.make_graph(
        [helper.make_node("DFT", inputs, ["y"], **attributes)], "dft",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 6, 10, last])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], initializers)
    model = _onnx_model(graph, tmp_path / "dft.onnx", opset)
    checks = _verified(model, tmp_path / "out")
    assert max(c.rel_err for c in checks) < 1e-5


def test_masked_scatter_places_the_source_in_mask_order(tmp_path):
    """Higgs Audio places its audio embeddings among the text's with ``masked_scatter``, which
    TVM's importer has no converter for: a mask over all axes, and one broadcast over the
    last."""
    from tvmfuse import api

    class Scatter(torch.nn.Module):
        def forward(self, x, ids, source):
            audio = ids > 5
            return (x.masked_scatter(audio.unsqueeze(-1), source),
                    x.masked_scatter(x > 0, source))

    model = api.import_torch(Scatter(), (torch.randn(2, 8, 3), torch.randint(0, 10, (2, 8)),
                                         torch.randn(48, 3)))
    checks = _verified(model, tmp_path / "out")
    assert len(checks) == 2 and max(c.rel_err for c in checks) == 0


@pytest.mark.parametrize("reduce", ["sum", "prod", "mean", "amax", "amin"])
@pytest.mark.parametrize("include_self", [True, False])
def test_scatter_reduce_reduces_as_pytorch_does(tmp_path, reduce, include_self):
    """TAPAS reduces its cells' values into segments with ``scatter_reduce`` (no converter in
    TVM's importer): each reduction, with and without the held values, some segments empty,
    and an index shorter than its source along the scattered axis."""
    from tvmfuse import api

    class Segments(torch.nn.Module):
        def forward(self, x, index, src):
            return x.scatter_reduce(1, index, src, reduce=reduce, include_self=include_self)

    index = torch.tensor([[0, 2, 2, 5], [1, 1, 1, 0], [5, 4, 2, 0]])  # segment 3 never indexed
    model = api.import_torch(Segments(), (torch.rand(3, 6) + 0.5, index, torch.rand(3, 5) + 0.5))
    (check,) = _verified(model, tmp_path / "out")
    assert check.rel_err < 1e-6, check


def test_unfold_takes_pytorchs_windows(tmp_path):
    """UnivNet cuts its hidden states into overlapping windows with ``Tensor.unfold`` (no
    converter in TVM's importer): windows along a middle and the last axis, steps below, at
    and above the window size (a step that leaves a remainder drops it)."""
    from tvmfuse import api

    class Windows(torch.nn.Module):
        def forward(self, x):
            return x.unfold(1, 3, 2) * 2, x.unfold(2, 2, 2), x.unfold(-1, 2, 3)

    model = api.import_torch(Windows(), (torch.randn(2, 9, 7),))
    checks = _verified(model, tmp_path / "out")
    assert len(checks) == 3 and max(c.rel_err for c in checks) == 0


def test_factory_that_cannot_load_is_one_clear_error():
    with pytest.raises(TvmfuseError, match="cannot load model factory 'no_such_pkg.models:make'"):
        import_model("no_such_pkg.models:make")


def test_missing_model_file_is_an_error(tmp_path):
    with pytest.raises(TvmfuseError, match="does not exist"):
        import_model(str(tmp_path / "missing.onnx"))


def test_corrupt_onnx_file_is_an_error(tmp_path):
    path = tmp_path / "broken.onnx"
    path.write_bytes(b"\x00not a protobuf at all")
    with pytest.raises(TvmfuseError, match="cannot read ONNX file"):
        import_model(str(path))


class _SelfAttention(torch.nn.Module):
    def __init__(self, dim=32, heads=4):
        super().__init__()
        self.heads, self.qkv = heads, torch.nn.Linear(dim, 3 * dim)

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = (t.reshape(b, s, self.heads, d // self.heads).transpose(1, 2)
                   for t in self.qkv(x).chunk(3, -1))
        return torch.nn.functional.scaled_dot_product_attention(q, k, v)


def test_flop_count_includes_cpu_attention():
    """PyTorch's counter has no formula for SDPA's CPU kernel: its two GEMMs were counted 0."""
    from tvmfuse import api
    from tvmfuse.frontend import count_flops

    seq, dim = 50, 32
    model = api.import_torch(_SelfAttention(dim).eval(), [torch.randn(1, seq, dim)])
    projection = 2 * seq * dim * 3 * dim
    assert count_flops(model) == projection + 2 * 2 * seq * seq * dim


def test_float_math_on_integer_tensors_is_promoted_as_pytorch_does(tmp_path):
    """DeBERTa takes torch.log of int64 relative positions: PyTorch promotes the integers to
    float32, TVM's relax.log refuses them; the importer casts them first, and nothing else."""

    path = _write_factory(tmp_path, """
        import torch

        class Buckets(torch.nn.Module):
            def forward(self, x, positions):
                distance = positions.abs().clamp(min=1)
                scaled = torch.log(distance) / torch.sqrt(distance) + distance / 3
                return x * scaled + positions.to(x.dtype), torch.exp(positions.neg())

        def make():
            return Buckets(), (torch.randn(2, 9), torch.arange(-9, 9).reshape(2, 9))
    """)
    model = import_model(f"{path}:make")
    # every float-only op reads float32: the integers were cast before it, as PyTorch promotes
    math = [c for c in _calls(model.mod)
            if c.op.name in ("relax.log", "relax.sqrt", "relax.exp", "relax.divide")]
    assert len(math) == 5  # log, sqrt, their quotient, distance / 3, exp
    assert all(str(arg.ty.dtype) == "float32" for c in math for arg in c.args)
    checks = _verified(model, tmp_path / "out")
    assert len(checks) == 2 and all(c.rel_err < 1e-6 for c in checks)


def _calls(mod) -> list:
    found = []
    relax.analysis.post_order_visit(
        mod["main"], lambda e: found.append(e) if isinstance(e, relax.Call) and
        isinstance(e.op, tvm.ir.Op) else None)
    return found

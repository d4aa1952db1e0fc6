"""Import a model into Relax: a zoo name, a ``package.module:factory``, a ``.pt2`` file or an ONNX
file. PyTorch goes through ``torch.export``; ONNX through TVM's ONNX frontend.

Every import also yields example inputs and a reference (PyTorch, or ONNX Runtime for ONNX files)
that the verifier runs on them. Weights stay bound as constants so later passes can fold them.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import importlib
import importlib.util
import inspect
import io
import logging
import pickle
import re
import sys
import types
import warnings
import zipfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import torch
import tvm
from torch.export.pt2_archive import _package as torch_package
from torch.utils import _pytree
from torch.utils.flop_counter import FlopCounterMode
from tvm import relax
from tvm.relax.frontend.onnx import from_onnx
from tvm.relax.frontend.torch import from_exported_program

from . import zoo
from .converters import CONVERTERS, dft_tables
from .errors import TvmfuseError, one_line
from .passes import DecomposeClip, SimplifyBoundedShapes, WidenIntegerCumsum
from .specs import (
    SEED,
    TensorSpec,
    check_dynamic,
    format_shape,
    parse_shape,
    random_inputs,
)

log = logging.getLogger(__name__)

Reference = Callable[..., list[np.ndarray]]


@dataclass
class ImportedModel:
    """A model in Relax with what the build, the manifest and the verifier need to know of it."""

    source: str
    kind: str  # "zoo", "factory", "pt2" or "onnx"
    mod: object  # tvm.IRModule; typed loosely to keep TVM out of the signature
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    example_inputs: list[np.ndarray]
    reference: Reference | None
    reference_name: str | None
    torch_module: object | None = None  # the nn.Module behind a PyTorch import
    #: Where integer inputs are drawn from (name -> [low, high)), for inputs at other shapes.
    value_ranges: dict = field(default_factory=dict)
    #: The largest size of each bounded symbolic dimension (``{"seq": 512}``).
    bounds: dict = field(default_factory=dict)
    #: The torch.export program run by PyTorch, where the reference is the module itself: it
    #: tells a build that is wrong from a module that its export does not capture.
    exported: Reference | None = None

    def reference_in(self, dtype: str, device: str = "cpu") -> Reference:
        """The PyTorch module computing in ``dtype`` (float16, bfloat16) on ``device``, on a
        copy: what a build in that precision is held against (:mod:`tvmfuse.verify`). Float
        inputs are cast to ``dtype``, float outputs returned in float32."""
        precision = getattr(torch, dtype)
        module = copy.deepcopy(self.torch_module).to(device=device, dtype=precision)

        def reference(*arrays):
            args = (torch.from_numpy(a).to(device, precision if a.dtype.kind == "f" else None)
                    for a in arrays)
            with torch.no_grad():
                return _flatten_torch(map_floats(module(*args), lambda t: t.float()))

        return reference

    def drawn(self, seed: int) -> list[np.ndarray]:
        """Random inputs of the examples' shapes, drawn with ``seed`` as the examples were."""
        specs = [replace(s, shape=a.shape) for s, a in zip(self.inputs, self.example_inputs)]
        return random_inputs(specs, self.value_ranges, seed=seed)

    def inputs_at(self, sizes: dict[str, int]) -> list[np.ndarray]:
        """Seeded random inputs with the symbolic dimensions at ``sizes``, drawn as the
        examples were."""
        return random_inputs(self.inputs, self.value_ranges, sizes=sizes)


def import_model(
    source: str, *, input_shapes: Sequence[str] = (), dynamic: Sequence[str] = (),
    batch: int | None = None, max_seq: int | None = None,
) -> ImportedModel:
    """Import ``source`` into Relax.

    Parameters
    ----------
    source : str
        A zoo name, a ``.pt2`` or ``.onnx`` path, or ``package.module:factory`` (also
        ``path/to/file.py:factory``). A factory returns an ``nn.Module`` or ``(module, inputs)``.
    input_shapes : sequence of str
        One ``1,3,224,224[:dtype]`` per model input, overriding the example shapes.
    dynamic : sequence of str
        Dimensions kept symbolic in Relax: ``"batch"`` (axis 0 of every input), ``"seq"`` (axis 1
        of every integer input of two or more dimensions, token ids and masks, up to
        ``max_seq``).
    batch : int, optional
        Example batch size: axis 0 of every input (after ``input_shapes``).
    max_seq : int, optional
        The longest sequence a ``seq``-dynamic build runs (its memory is planned for it).
    """
    check_dynamic(dynamic, max_seq)
    overrides = [parse_shape(s) for s in input_shapes]
    if batch is not None and batch < 1:
        raise TvmfuseError(f"batch must be at least 1, not {batch}")
    path = Path(source)
    if path.suffix in (".pt2", ".onnx"):
        if not path.is_file():
            raise TvmfuseError(f"model file {source} does not exist")
        if "seq" in dynamic:
            raise TvmfuseError(f"--dynamic seq is for PyTorch models (a factory or the zoo); "
                               f"{path.name} fixed its shapes when it was exported")
        if path.suffix == ".onnx":
            return _import_onnx(path, overrides, dynamic, batch)
        return _import_pt2(path, overrides, dynamic, batch)
    if source in zoo.registry():
        entry = zoo.get(source)
        module, examples = entry.load()
        specs, ranges = ((entry.inputs, entry.value_ranges) if examples is None
                         else _specs_of(module, examples))
        specs = _with_batch(_apply_overrides(source, specs, overrides), batch)
        return _import_torch(source, "zoo", module, specs, ranges, dynamic, max_seq)
    if ":" in source:
        module, examples = _call_factory(source)
        specs, ranges = _specs_of(module, examples)
        specs = _with_batch(_apply_overrides(source, specs, overrides), batch)
        return _import_torch(source, "factory", module, specs, ranges, dynamic, max_seq)
    raise zoo.unknown(source)


# --- PyTorch ---------------------------------------------------------------------------------


def import_torch(module, example_inputs, *, name: str = "module",
                 dynamic: Sequence[str] = (), max_seq: int | None = None) -> ImportedModel:
    """Import an ``nn.Module`` object directly, with example inputs (tensors or arrays);
    ``dynamic`` and ``max_seq`` as for :func:`import_model`."""
    check_dynamic(dynamic, max_seq)
    arrays = [np.asarray(t.detach().numpy() if hasattr(t, "detach") else t) for t in example_inputs]
    names = list(inspect.signature(module.forward).parameters)
    specs = tuple(TensorSpec(n, a.shape, str(a.dtype)) for n, a in zip(names, arrays))
    model = _import_torch(name, "module", module.eval(), specs, {}, dynamic, max_seq)
    model.example_inputs = arrays
    return model


def _call_factory(source: str):

    target, _, attr = source.rpartition(":")
    try:
        if target.endswith(".py"):
            spec = importlib.util.spec_from_file_location(Path(target).stem, target)
            if spec is None or not Path(target).is_file():
                raise ImportError(f"no file {target}")
            pymod = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(pymod)
        else:
            if "" not in sys.path:
                sys.path.insert(0, "")
            pymod = importlib.import_module(target)
        factory = getattr(pymod, attr)
    except (ImportError, AttributeError) as err:
        raise TvmfuseError(f"cannot load model factory {source!r}: {err}") from None
    except Exception as err:  # noqa: BLE001 - the user's module: a SyntaxError, whatever it raises
        raise TvmfuseError(f"cannot load model factory {source!r}: {type(err).__name__}: "
                           f"{one_line(err)}") from None
    torch.manual_seed(SEED)
    try:
        made = factory()
    except Exception as err:  # noqa: BLE001 - the user's code
        raise TvmfuseError(f"model factory {source!r} raised {type(err).__name__}: "
                           f"{one_line(err)}") from None
    module, examples = made if isinstance(made, tuple) else (made, None)
    if not isinstance(module, torch.nn.Module):
        raise TvmfuseError(
            f"factory {source!r} returned {type(module).__name__}, not a torch.nn.Module"
        )
    if examples is not None and not isinstance(examples, (tuple, list)):
        examples = (examples,)
    odd = next((e for e in examples or () if not isinstance(e, torch.Tensor)), None)
    if odd is not None:
        raise TvmfuseError(f"factory {source!r} returned example inputs holding a "
                           f"{type(odd).__name__}, not tensors; return (module, (tensor, ...)), "
                           f"one tensor per argument of forward")
    return module.eval(), examples


def _specs_of(module, examples) -> tuple[tuple[TensorSpec, ...], dict]:
    """The input specs of a factory's module, named after its ``forward``'s parameters and
    shaped as its example tensors (without examples, shapes must come from ``--input-shape``),
    and the value range of each integer example (token ids, masks): the inputs drawn for
    verification stay within what the model was shown."""
    names = list(inspect.signature(module.forward).parameters)
    if examples is None:
        return tuple(TensorSpec(n, (), "float32") for n in names), {}
    specs = tuple(
        TensorSpec(n, tuple(t.shape), str(t.dtype).removeprefix("torch."))
        for n, t in zip(names, examples)
    )
    examples = dict(zip(names, examples))
    ranges = {}
    for spec in specs:
        example = examples.get(spec.name)
        if example is not None and not example.is_floating_point() and example.numel():
            ranges[spec.name] = (int(example.min()), int(example.max()) + 1)
    return specs, ranges


def _apply_overrides(source, specs, overrides) -> tuple[TensorSpec, ...]:
    if not overrides:
        if any(s.shape == () for s in specs):
            raise TvmfuseError(
                f"{source} gives no example inputs; pass --input-shape once per input"
            )
        return tuple(specs)
    if len(overrides) != len(specs):
        raise TvmfuseError(
            f"{source} takes {len(specs)} input(s) ({', '.join(s.name for s in specs)}), "
            f"but {len(overrides)} --input-shape were given"
        )
    return tuple(
        replace(s, shape=shape, dtype=dtype or s.dtype)
        for s, (shape, dtype) in zip(specs, overrides)
    )


def _with_batch(specs, batch: int | None) -> tuple[TensorSpec, ...]:
    if batch is None:
        return tuple(specs)
    if any(not s.shape for s in specs):
        raise TvmfuseError("batch needs every input to have at least one dimension")
    return tuple(replace(s, shape=(batch, *s.shape[1:])) for s in specs)


def _import_torch(source, kind, module, specs, value_ranges, dynamic,
                  max_seq=None) -> ImportedModel:

    examples = random_inputs(specs, value_ranges)
    args = tuple(torch.from_numpy(a) for a in examples)
    concrete = specs  # the example shapes, which later draws of inputs keep
    dynamic_shapes = None
    if dynamic:
        axes = _dynamic_axes(source, specs, dynamic, max_seq)
        if "batch" in dynamic:
            # torch.export specialises a dimension whose example is 1, so export at batch 2.
            args = tuple(torch.cat([a, a]) if a.shape[0] == 1 else a for a in args)
        dynamic_shapes = tuple({axis: dim for axis, (_, dim) in named.items()} or None
                               for named in axes)
        if _takes_varargs(module):  # torch.export sees forward(*args)'s inputs as one tuple
            dynamic_shapes = (dynamic_shapes,)
        specs = tuple(replace(s, shape=tuple(named[i][0] if i in named else d
                                             for i, d in enumerate(s.shape)))
                      for s, named in zip(specs, axes))
    try:
        with torch.no_grad(), _quiet_torch(), batched_experts(module):
            program = torch.export.export(module, args, dynamic_shapes=dynamic_shapes)
    except Exception as err:  # noqa: BLE001 - torch raises many types; the user needs one line
        shapes = ", ".join(f"{s.name}{format_shape(s.shape)}:{s.dtype}" for s in specs)
        raise TvmfuseError(f"{source} cannot run on inputs {shapes}: {one_line(err)}") from None

    def reference(*arrays):
        with torch.no_grad():
            return _flatten_torch(module(*(torch.from_numpy(a) for a in arrays)))

    # The program as a module, made only when a failed --verify asks (a copy of the graph, 0.1 s
    # for BERT-base); the importer's rewrites of the program below keep PyTorch's semantics.
    @functools.cache
    def runnable():
        return program.module()

    def exported(*arrays):
        with torch.no_grad():
            return _flatten_torch(runnable()(*(torch.from_numpy(a) for a in arrays)))

    vocabularies = _embedding_ranges(program, specs, value_ranges)
    if vocabularies:  # token ids drawn in (0, 2) would leave the model's embeddings unread
        log.info("drawing %s below the embedding sizes %s", ", ".join(vocabularies),
                 ", ".join(str(high) for _, high in vocabularies.values()))
        value_ranges = {**value_ranges, **vocabularies}
        examples = random_inputs(concrete, value_ranges)
    try:  # torch.export traces with fake tensors: a dtype the module cannot take shows only here
        reference(*examples)
    except Exception as err:  # noqa: BLE001 - as above
        shapes = ", ".join(f"{s.name}{format_shape(s.shape)}:{s.dtype}" for s in specs)
        raise TvmfuseError(f"{source} cannot run on inputs {shapes}: {one_line(err)}") from None
    model = _from_exported(source, kind, program, specs, examples, reference, module,
                           bounds={"seq": max_seq} if "seq" in dynamic else {})
    model.value_ranges = dict(value_ranges)
    model.exported = exported
    return model


def _dynamic_axes(source, specs, dynamic, max_seq) -> list[dict[int, tuple[str, object]]]:
    """Per input, ``{axis: (name, torch.export.Dim)}`` of the ``dynamic`` dimensions it has."""
    batch = torch.export.Dim("batch", min=1)
    axes = [{0: ("batch", batch)} if "batch" in dynamic else {} for _ in specs]
    if "seq" in dynamic:
        ranked = [(i, s) for i, s in enumerate(specs) if len(s.shape) >= 2
                  and not np.issubdtype(np.dtype(s.dtype), np.floating)]
        lengths = {s.name: s.shape[1] for _, s in ranked}
        if not ranked:
            raise TvmfuseError(f"--dynamic seq: {source} has no token inputs (--dynamic seq "
                               f"makes axis 1 of integer inputs of two or more dimensions, token "
                               f"ids and masks, symbolic)")
        if len(set(lengths.values())) > 1:
            given = ", ".join(f"{name} {length}" for name, length in lengths.items())
            raise TvmfuseError(f"--dynamic seq: the inputs of {source} differ on axis 1 ({given});"
                               f" one symbolic length needs them equal")
        length = next(iter(lengths.values()))
        if not 2 <= length <= max_seq:
            raise TvmfuseError(f"--dynamic seq: the example length {length} is not within 2.."
                               f"{max_seq} (--max-seq); give an example length in that range "
                               f"with --input-shape")
        seq = torch.export.Dim("seq", min=1, max=max_seq)
        for i, _ in ranked:
            axes[i][1] = ("seq", seq)
    return axes


def _takes_varargs(module) -> bool:
    parameters = inspect.signature(module.forward).parameters.values()
    return any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in parameters)


def _embedding_ranges(program, specs, known) -> dict[str, tuple[int, int]]:
    """``(0, vocabulary)`` for each integer input without a known range that indexes an
    embedding table (``aten.embedding``) directly, from the exported graph."""
    integer = {s.name for s in specs if not np.issubdtype(np.dtype(s.dtype), np.floating)}
    user_inputs = dict(zip(program.graph_signature.user_inputs, (s.name for s in specs)))
    ranges = {}
    for node in program.graph.nodes:
        if node.op != "call_function" or node.target is not torch.ops.aten.embedding.default:
            continue
        weight, indices = node.args[0], node.args[1]
        name = user_inputs.get(getattr(indices, "name", None))
        if name in integer and name not in known:
            rows = int(weight.meta["val"].shape[0])
            low, high = ranges.get(name, (0, rows))
            ranges[name] = (low, min(high, rows))
    return ranges


def _import_pt2(path: Path, overrides, dynamic, batch) -> ImportedModel:

    if dynamic:
        raise TvmfuseError(
            f"{path} fixed its dynamic dimensions when it was exported; drop --dynamic"
        )
    program = _load_export(path)
    placeholders = {n.name: n for n in program.graph.nodes if n.op == "placeholder"}
    specs = []
    for name in program.graph_signature.user_inputs:
        val = placeholders[name].meta["val"]
        shape = tuple(d if isinstance(d, int) else str(d) for d in val.shape)
        specs.append(TensorSpec(name, shape, str(val.dtype).removeprefix("torch.")))
    specs = _apply_overrides(str(path), specs, overrides) if overrides else tuple(specs)
    specs = _with_batch(specs, batch)
    examples = random_inputs(specs)
    runnable = program.module()

    def reference(*arrays):
        with torch.no_grad():
            return _flatten_torch(runnable(*(torch.from_numpy(a) for a in arrays)))

    return _from_exported(str(path), "pt2", program, specs, examples, reference, runnable)


class _Unsafe(Exception):
    """A member of a ``.pt2`` file that only pickle, running code of the file's choosing, loads.
    (Not a RuntimeError: ``torch.export.load`` retries an older format on those.)"""


#: Folder of a ``.pt2`` archive holding AOTInductor's compiled libraries: loading one runs it.
_AOTI_DIR = "data/aotinductor/"


def _load_export(path: Path):
    """``torch.export.load(path)``, executing nothing from the file: every pickled member
    (sample inputs, pickled weights and constants) goes through torch's weights-only unpickler,
    which builds tensors and containers and calls no other function; a member that needs more
    (an arbitrary object, a TorchScript object, a compiled AOTInductor library) is refused."""
    try:
        with zipfile.ZipFile(path) as archive:
            compiled = [n for n in archive.namelist() if _AOTI_DIR in n]
    except (OSError, zipfile.BadZipFile) as err:
        raise TvmfuseError(f"cannot load exported program {path}: {one_line(err)}") from None
    if compiled:
        raise TvmfuseError(f"{path} holds a compiled AOTInductor library ({compiled[0]}), which "
                           f"tvmfuse does not run; save the program with torch.export.save")
    load = torch.load

    def weights_only(f, *args, **kwargs):
        kwargs["weights_only"] = True
        try:
            return load(f, *args, **kwargs)
        except pickle.UnpicklingError as err:  # the unpickler's finding, not its advice
            found = [line for line in str(err).splitlines() if "Unpickler error:" in line]
            raise _Unsafe(found[0].split("error:", 1)[1] if found else "not plain tensors") \
                from None

    def refuse(*_args, **_kwargs):
        raise _Unsafe("it holds a pickled Python or TorchScript object")

    saved = (torch.load, torch._C._pickle_load_obj, torch_package.pickle)
    torch.load, torch._C._pickle_load_obj = weights_only, refuse
    torch_package.pickle = types.SimpleNamespace(loads=refuse)
    try:
        with _quiet_torch(), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the unpickler's protocol notes: we report one line
            return torch.export.load(str(path))
    except _Unsafe as err:
        raise TvmfuseError(f"refusing to load {path}: loading it would run code stored in the "
                           f"file ({one_line(err, 120)}); export the model again with "
                           f"torch.export.save, or build it from its module") from None
    except Exception as err:  # noqa: BLE001
        raise TvmfuseError(f"cannot load exported program {path}: {one_line(err)}") from None
    finally:
        torch.load, torch._C._pickle_load_obj, torch_package.pickle = saved


def map_floats(tree, fn):
    """``fn`` applied to every floating-point tensor of a PyTorch output ``tree``."""
    return _pytree.tree_map(lambda t: fn(t) if isinstance(t, torch.Tensor)
                            and t.is_floating_point() else t, tree)


def _flatten_torch(out) -> list[np.ndarray]:

    return [t.detach().cpu().numpy() for t in _pytree.tree_leaves(out)]


def _from_exported(source, kind, program, specs, examples, reference, module,
                   bounds=None) -> ImportedModel:

    _drop_empty_concat_inputs(program)
    _sort_topk(program)
    _promote_concat_inputs(program)
    _promote_integer_math(program)
    try:
        mod = from_exported_program(program, custom_convert_map=CONVERTERS)
    except Exception as err:  # noqa: BLE001 - an unsupported op surfaces as many error types
        raise TvmfuseError(f"TVM cannot import {source}: {one_line(err)}") from None
    mod = WidenIntegerCumsum()(mod)  # the importer types torch's cumsum as its input's dtype
    mod = DecomposeClip(integer_only=True)(mod)  # integer clamps arrive with an inf bound
    if bounds:  # torch.export's ranges are the importer's tir_var_upper_bound
        mod = SimplifyBoundedShapes()(mod)
    return ImportedModel(
        source, kind, mod, tuple(specs), _output_specs(mod, specs), examples, reference, "pytorch",
        module, bounds=dict(bounds or {}),
    )


def _drop_empty_concat_inputs(program) -> None:
    """Drop the empty tensors from every ``aten.cat``, which add nothing to it. PyTorch itself
    skips 1-D empty ones (a legacy rule): transformers' KV cache starts each layer as
    ``torch.tensor([])`` and concatenates the first keys onto it, which TVM's importer refuses
    ("Concat expects all input tensors to have same ndim"). An empty tensor of the cat's rank
    (DINOv3's zero register tokens, ``[1, 0, 64]``) became a constant of no elements, which TVM
    writes into the library in a form its loader refuses ("Invalid DLTensor file format")."""
    for node in program.graph.nodes:
        if node.op != "call_function" or node.target is not torch.ops.aten.cat.default:
            continue
        tensors = node.args[0]
        kept = [t for t in tensors if not _empty(t)]
        if kept and len(kept) < len(tensors):
            node.args = (kept, *node.args[1:])


def _sort_topk(program) -> None:
    """An unsorted ``aten.topk`` made sorted: PyTorch leaves the order of an unsorted top-k to
    the implementation, so the sorted order is one it may return; TVM's importer takes only
    sorted ones (the routers of ERGO and EXAONE-MoE ask for unsorted experts)."""
    for node in program.graph.nodes:
        if node.op == "call_function" and node.target is torch.ops.aten.topk.default:
            if len(node.args) > 4 and not node.args[4]:
                node.args = (*node.args[:4], True, *node.args[5:])
            if node.kwargs.get("sorted") is False:
                node.kwargs = {**node.kwargs, "sorted": True}


def _promote_concat_inputs(program) -> None:
    """Cast the inputs of an ``aten.cat`` to the dtype of its result, as PyTorch's type
    promotion does: FLAVA concatenates float32 embeddings with int64 ones, which TVM's importer
    refuses ("Concat expects all input tensors to have the same dtype")."""
    graph = program.graph
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target is not torch.ops.aten.cat.default:
            continue
        result = node.meta.get("val")
        if not isinstance(result, torch.Tensor):
            continue
        tensors = list(node.args[0])
        for i, arg in enumerate(tensors):
            value = getattr(arg, "meta", {}).get("val")
            if not isinstance(value, torch.Tensor) or value.dtype == result.dtype:
                continue
            tensors[i] = _cast_before(graph, node, arg, result.dtype)
        node.args = (tensors, *node.args[1:])
    graph.lint()


#: Float-only math that PyTorch computes on an integer tensor by promoting it to its default float
#: dtype first (``torch.log(torch.arange(4))`` is float32); TVM's ops refuse integer inputs.
_PROMOTING_OPS = frozenset(
    getattr(torch.ops.aten, name).default
    for name in ("log", "log2", "log10", "log1p", "exp", "exp2", "expm1", "sqrt", "rsqrt",
                 "reciprocal", "sin", "cos", "tan", "tanh", "sigmoid", "erf", "asin", "acos",
                 "atan", "sinh", "cosh", "asinh", "acosh", "atanh")
) | {torch.ops.aten.div.Tensor, torch.ops.aten.div.Scalar, torch.ops.aten.true_divide.Tensor}


def _promote_integer_math(program) -> None:
    """Cast the integer operands of float-only math (:data:`_PROMOTING_OPS`) to the float dtype
    PyTorch computed in, as PyTorch's type promotion does implicitly: DeBERTa's relative
    position buckets take ``torch.log`` of an int64 tensor, which TVM's importer refuses
    ("relax.log requires the input tensor to have float dtype")."""
    graph = program.graph
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target not in _PROMOTING_OPS:
            continue
        result = node.meta.get("val")
        if not isinstance(result, torch.Tensor) or not result.dtype.is_floating_point:
            continue
        args = list(node.args)
        for i, arg in enumerate(args):
            value = getattr(arg, "meta", {}).get("val") if isinstance(arg, torch.fx.Node) else None
            if not isinstance(value, torch.Tensor) or value.dtype.is_floating_point:
                continue
            args[i] = _cast_before(graph, node, arg, result.dtype)
        node.args = tuple(args)
    graph.lint()


def _cast_before(graph, node, arg, dtype):
    """A new ``aten._to_copy`` of ``arg`` to ``dtype`` in ``graph`` ahead of ``node``, typed as
    torch.export types its nodes (a fake ``val``)."""
    with graph.inserting_before(node):
        cast = graph.call_function(torch.ops.aten._to_copy.default, (arg,), {"dtype": dtype})
    value = arg.meta["val"]
    with _fake_mode_of(value):
        cast.meta["val"] = value.to(dtype)
    return cast


def _fake_mode_of(value):
    """The fake-tensor mode ``value`` was traced under (a no-op context for a real tensor)."""
    mode = torch._guards.detect_fake_mode([value])
    return mode if mode is not None else contextlib.nullcontext()


def _empty(node) -> bool:
    """A tensor with a dimension of 0 elements (a symbolic dimension is not known to be)."""
    value = getattr(node, "meta", {}).get("val")
    return value is not None and any(isinstance(d, int) and d == 0 for d in value.shape)


def count_flops(model: ImportedModel) -> float | None:
    """Floating-point operations of one inference (an FMA counts 2), counted by PyTorch's
    FlopCounterMode on the example inputs; None for models without a PyTorch module.
    FlopCounterMode has no formula for the kernel that ``scaled_dot_product_attention`` runs on
    the CPU: without :func:`_cpu_attention_flops` a transformer's attention counted 0."""
    if model.torch_module is None:
        return None

    counter = FlopCounterMode(display=False, custom_mapping={
        torch.ops.aten._scaled_dot_product_flash_attention_for_cpu: _cpu_attention_flops})
    with torch.no_grad(), counter:
        model.torch_module(*(torch.from_numpy(a) for a in model.example_inputs))
    return float(counter.get_total_flops()) or None


def _cpu_attention_flops(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs):
    """Both GEMMs of one attention, ``[batch, heads, queries, dim]`` queries against keys and
    values of as many or fewer heads (grouped-query attention, which PyTorch 2.11's own
    ``sdpa_flop_count`` refuses as incompatible shapes)."""
    batch, heads, queries, dim = query_shape
    keys, value_dim = key_shape[-2], value_shape[-1]
    return 2 * batch * heads * queries * keys * (dim + value_dim)


# --- ONNX ------------------------------------------------------------------------------------


def _import_onnx(path: Path, overrides, dynamic, batch) -> ImportedModel:
    try:
        import onnx  # noqa: PLC0415 - the optional 'onnx' extra
    except ImportError:
        raise TvmfuseError(
            "ONNX import needs the 'onnx' extra: pip install 'tvmfuse[onnx]'") from None

    try:
        model = onnx.load(str(path))
    except Exception as err:  # noqa: BLE001 - protobuf's decode errors
        raise TvmfuseError(f"cannot read ONNX file {path}: {one_line(err)}") from None
    initializers = {i.name for i in model.graph.initializer}
    specs = []
    for value in model.graph.input:
        if value.name in initializers:
            continue
        ttype = value.type.tensor_type
        dims = tuple(
            d.dim_value if d.HasField("dim_value") else (d.dim_param or f"{value.name}_{i}")
            for i, d in enumerate(ttype.shape.dim)
        )
        dtype = str(onnx.helper.tensor_dtype_to_np_dtype(ttype.elem_type))
        specs.append(TensorSpec(value.name, dims, dtype))
    if overrides:
        specs = _apply_overrides(str(path), specs, overrides)
    specs = list(_with_batch(specs, batch))
    if "batch" in dynamic:
        specs = [replace(s, shape=("batch", *s.shape[1:])) for s in specs]
    specs = tuple(specs)
    symbols = {}  # one tirx.Var per symbolic name, shared by every input that uses it
    shape_dict = {
        s.name: [symbols.setdefault(d, tvm.tirx.Var(d, "int64")) if isinstance(d, str) else d
                 for d in s.shape]
        for s in specs
    }
    # TVM's ONNX frontend prints the failing operator with its inputs' whole IR and warns about
    # every input it renames: one line of ours says what matters
    _sort_onnx_topk(model.graph)
    _scalar_constants_of_shape(model.graph)
    _listed_unsqueeze_axes(model.graph)
    _dft_as_matmuls(model)
    printed = io.StringIO()
    try:
        with contextlib.redirect_stdout(printed), warnings.catch_warnings(), \
                _einsum_as_relax_op():
            warnings.simplefilter("ignore")
            mod = from_onnx(model, shape_dict=shape_dict,
                            dtype_dict={s.name: s.dtype for s in specs})
    except Exception as err:  # noqa: BLE001
        op = re.search(r"Error converting operator (\w+)", printed.getvalue())
        where = f" (operator {op.group(1)})" if op else ""
        raise TvmfuseError(f"TVM cannot import {path}{where}: {one_line(err)}") from None
    reference = _onnxruntime_reference(path)
    return ImportedModel(
        str(path), "onnx", mod, specs,
        _output_specs(mod, specs, [o.name for o in model.graph.output]), random_inputs(specs),
        reference, "onnxruntime" if reference else None,
    )


def _sort_onnx_topk(graph) -> None:
    """An unsorted TopK made sorted, as :func:`_sort_topk` does for PyTorch's (ONNX leaves the
    order of an unsorted one open too; TVM's frontend refuses it: "TopK sorted must be 1"). The
    model in memory changes; the file and ONNX Runtime's reference read from it do not."""
    for node in graph.node:
        if node.op_type == "TopK":
            for attribute in node.attribute:
                if attribute.name == "sorted":
                    attribute.i = 1


@contextlib.contextmanager
def _einsum_as_relax_op():
    """TVM's ONNX frontend imports Einsum as ``relax.einsum`` instead of that op's TE
    legalization (a generic compute no schedule rule takes), so that
    :class:`tvmfuse.passes.EinsumAsMatmul` sees the einsums that are matrix products; the
    others are legalized as before."""
    from tvm.relax.frontend.onnx import onnx_frontend  # noqa: PLC0415

    converter = onnx_frontend.Einsum
    original = converter.__dict__["_impl_v12"]
    converter._impl_v12 = classmethod(  # noqa: SLF001 - TVM's converter, for this import only
        lambda cls, bb, inputs, attr, params: relax.op.einsum(
            list(inputs), attr["equation"].decode("utf-8")))
    try:
        yield
    finally:
        converter._impl_v12 = original  # noqa: SLF001


def _scalar_constants_of_shape(graph) -> None:
    """A ConstantOfShape of the empty shape (a scalar: GIT's ``new_zeros(())``) made a
    Constant: TVM's frontend broadcasts the value's one element to shape () and refuses ("the
    given tensor has ndim 1 while the target shape has ndim 0")."""
    import onnx  # noqa: PLC0415

    empty = {i.name for i in graph.initializer if len(i.dims) == 1 and i.dims[0] == 0}
    for index, node in enumerate(graph.node):
        if node.op_type != "ConstantOfShape" or node.input[0] not in empty:
            continue
        value = next((onnx.numpy_helper.to_array(a.t) for a in node.attribute
                      if a.name == "value"), np.zeros(1, "float32"))
        graph.node[index].CopyFrom(onnx.helper.make_node(
            "Constant", [], list(node.output), name=node.name,
            value=onnx.numpy_helper.from_array(value.reshape(()))))


def _listed_unsqueeze_axes(graph) -> None:
    """The axes of an Unsqueeze given as a scalar initializer (GLM-ASR's encoder; ONNX Runtime
    takes it) made a list of one: TVM's frontend iterates them ("'int' object is not
    iterable")."""
    axes = {node.input[1] for node in graph.node
            if node.op_type == "Unsqueeze" and len(node.input) > 1}
    for initializer in graph.initializer:
        if initializer.name in axes and len(initializer.dims) == 0:
            initializer.dims.append(1)


def _dft_as_matmuls(model) -> None:
    """Each ONNX DFT over an axis of static length (FNet's token mixing) as products with the
    cosine and sine tables of that length, as tvmfuse's converters import PyTorch's FFTs; TVM's
    frontend has no DFT. A DFT with a ``dft_length``, or whose input's shape is not known, is
    left (TVM then names it)."""
    import onnx  # noqa: PLC0415

    if not any(node.op_type == "DFT" for node in model.graph.node):
        return
    inferred = onnx.shape_inference.infer_shapes(model).graph
    shapes = {v.name: [d.dim_value if d.HasField("dim_value") else None
                       for d in v.type.tensor_type.shape.dim]
              for v in (*inferred.input, *inferred.value_info)}
    shapes.update({i.name: list(i.dims) for i in model.graph.initializer})
    constants = {i.name: onnx.numpy_helper.to_array(i) for i in model.graph.initializer}
    graph, nodes = model.graph, []
    for index, node in enumerate(graph.node):
        shape = shapes.get(node.input[0])
        if node.op_type != "DFT" or shape is None or None in shape \
                or len(node.input) > 1 and node.input[1]:
            nodes.append(node)
            continue
        attributes = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        axis = attributes.get("axis", 1)
        if len(node.input) > 2 and node.input[2]:
            if node.input[2] not in constants:
                nodes.append(node)
                continue
            axis = int(constants[node.input[2]])
        axis %= len(shape)
        nodes += _dft_nodes(graph, node, shape, axis, bool(attributes.get("inverse", 0)),
                            bool(attributes.get("onesided", 0)), f"tvmfuse_dft{index}")
    del graph.node[:]
    graph.node.extend(nodes)


def _dft_nodes(graph, node, shape, axis, inverse, onesided, name) -> list:
    """The nodes of one DFT (see :func:`_dft_as_matmuls`): the input's real and imaginary parts
    (a last axis of 1 or 2), the DFT axis swapped with that last axis, products with the tables,
    swapped back, the parts concatenated."""
    from onnx import helper, numpy_helper  # noqa: PLC0415

    n, rank = shape[axis], len(shape)
    cos, sin = dft_tables(n, 1 / n if inverse else 1.0, not inverse)
    graph.initializer.extend([numpy_helper.from_array(cos.astype("float32"), f"{name}_cos"),
                              numpy_helper.from_array(sin.astype("float32"), f"{name}_sin")])
    swap = list(range(rank))
    swap[axis], swap[-1] = swap[-1], swap[axis]
    made = []

    def op(kind, inputs, **attributes):
        out = f"{name}_{len(made)}"
        made.append(helper.make_node(kind, inputs, [out], name=out, **attributes))
        return out

    def part(i):  # [..., 1]: the real (0) or imaginary (1) part, its DFT axis last
        sliced = op("Slice", [node.input[0], _const(graph, f"{name}_s{i}", [i]),
                              _const(graph, f"{name}_e{i}", [i + 1]),
                              _const(graph, f"{name}_axis", [-1])])
        return op("Transpose", [sliced], perm=swap)

    real = part(0)
    imag = part(1) if shape[-1] == 2 else None
    # (re + i im)(cos + i sin): re cos - im sin, re sin + im cos
    new_real, new_imag = op("MatMul", [real, f"{name}_cos"]), op("MatMul", [real, f"{name}_sin"])
    if imag is not None:
        new_real = op("Sub", [new_real, op("MatMul", [imag, f"{name}_sin"])])
        new_imag = op("Add", [new_imag, op("MatMul", [imag, f"{name}_cos"])])
    parts = [op("Transpose", [p], perm=swap) for p in (new_real, new_imag)]
    if onesided:
        keep = _const(graph, f"{name}_keep", [n // 2 + 1])
        parts = [op("Slice", [p, _const(graph, f"{name}_zero", [0]), keep,
                              _const(graph, f"{name}_dft_axis", [axis])]) for p in parts]
    made.append(helper.make_node("Concat", parts, list(node.output), name=f"{name}_out",
                                 axis=-1))
    return made


def _const(graph, name: str, values) -> str:
    """An int64 initializer ``name`` of ``values`` (once per name)."""
    from onnx import numpy_helper  # noqa: PLC0415

    if not any(i.name == name for i in graph.initializer):
        graph.initializer.append(numpy_helper.from_array(np.array(values, "int64"), name))
    return name


def _onnxruntime_reference(path: Path) -> Reference | None:
    try:
        import onnxruntime as ort  # noqa: PLC0415
    except ImportError:
        log.warning("onnxruntime is not installed: ONNX builds cannot be verified")
        return None
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]

    def reference(*arrays):
        return list(session.run(None, dict(zip(names, arrays))))

    return reference


# --- shared ------------------------------------------------------------------------------------


def _output_specs(mod, inputs, names=()) -> tuple[TensorSpec, ...]:
    """Output specs from ``main``'s return type, naming symbolic dims as the inputs do;
    outputs are named ``names`` where given, else ``output0``, ``output1``, ..."""

    main = mod["main"]
    symbols = {}
    for param, spec in zip(main.params, inputs):
        for dim, want in zip(param.ty.shape.values, spec.shape):
            if isinstance(want, str):
                symbols[str(dim)] = want
    ret = main.ret_ty
    fields = ret.fields if isinstance(ret, relax.TupleType) else [ret]
    return tuple(
        TensorSpec(
            names[i] if i < len(names) else f"output{i}",
            tuple(
                int(d) if hasattr(d, "value") else symbols.get(str(d), str(d))
                for d in f.shape.values
            ),
            str(f.dtype),
        )
        for i, f in enumerate(fields)
    )


#: transformers' implementation of mixture-of-experts layers that an export keeps as ops TVM
#: imports: every token's experts' weights gathered, then batched matmuls.
EXPORTED_EXPERTS = "batched_mm"


def _switchable_experts(module) -> bool:
    """``module`` is a transformers model whose experts can be set, and are not batched_mm."""
    try:
        return (callable(getattr(module, "set_experts_implementation", None))
                and module._can_set_experts_implementation()
                and bool(set(module.get_experts_implementation().values())
                         - {EXPORTED_EXPERTS, None}))
    except Exception:  # noqa: BLE001 - another transformers version: exported as it is
        return False


@contextlib.contextmanager
def batched_experts(module):
    """transformers' mixture-of-experts models (Mixtral, Qwen-MoE, ...) set to
    :data:`EXPORTED_EXPERTS` while they are exported, then set back. Their default, grouped_mm,
    counts tokens per expert with ``histc`` and multiplies each expert's group through a custom
    op (``transformers.grouped_mm_fallback``) whose group sizes depend on the routing: TVM has no
    import for either. Both implementations compute the same sums."""
    models = [m for m in module.modules() if _switchable_experts(m)]
    outer = [m for m in models if not any(o is not m and any(s is m for s in o.modules())
                                          for o in models)]  # an outer model sets its inner ones
    switched = []
    try:
        for m in outer:
            saved = m.get_experts_implementation()
            try:
                m.set_experts_implementation(EXPORTED_EXPERTS)
            except Exception as err:  # noqa: BLE001 - exported as it is, and may still import
                log.info("cannot set %s's experts to %s: %s", type(m).__name__,
                         EXPORTED_EXPERTS, one_line(err))
                continue
            switched.append((m, saved))
            log.info("exporting %s's experts as %s", type(m).__name__, EXPORTED_EXPERTS)
        yield
    finally:
        for m, saved in switched:
            m.set_experts_implementation(saved)


@contextlib.contextmanager
def _quiet_torch():
    """Silence torch's own error logging (a traceback per failed trace); we report one line."""
    logger = logging.getLogger("torch")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(level)

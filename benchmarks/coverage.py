"""Sweep transformers' architectures: does each export, build and verify with tvmfuse on the CPU,
through ``torch.export`` and through ONNX, and why not; results for ``benchmarks/report.py`` in
``benchmarks/results/<machine-kind>/coverage.json``.

    python benchmarks/coverage.py [--only TYPE,...] [--offset N] [--limit N] [--resume]
        [--timeout S] [--kind KIND] [--json OUT] [--target T --dtype D] [--paths P] [--jobs N]
    python benchmarks/coverage.py --merge PART.json... [--json OUT]

Every model type of transformers' ``AutoModel`` mapping (the popular ones first) is built at a
small config: its config class's defaults with layers, widths, heads and vocabulary shrunk by
attribute name, weights random under a fixed seed, nothing downloaded. Its inputs follow the
model's ``main_input_name``; its output is the first tensor of what the model returns. Each model
and path runs in a process of its own under ``--timeout``, so a crash or a hang costs only that
model; the JSON is rewritten after every model, and ``--resume`` skips the model types it already
holds (each record names the commit that swept it); ``--merge`` files the records of sweeps run
in parallel (``--offset``/``--limit`` ranges, one core each) into the JSON by model type, a
part's record replacing the one it held. ``--target cuda-sm90 --dtype fp16 --paths torch --jobs 8``
sweeps on the GPU host (``bash benchmarks/gpu.sh coverage``), ``--jobs`` model types at a time.
A failure is filed under a cause (an op without a lowering, an importer error, an export error,
a numeric mismatch, an export that differs from eager PyTorch, a crash or timeout, a config or
inputs this script could not make) and the causes are printed largest first.
"""

from __future__ import annotations

import argparse
import inspect
import json
import re
import shlex
import subprocess
import sys
import tempfile
import traceback
from collections import Counter, defaultdict
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

from report import commit

REPO = Path(__file__).resolve().parent.parent
SEED = 0
#: Model types swept first, most used first; the rest of the mapping follows by name.
POPULAR = ("bert", "roberta", "distilbert", "gpt2", "llama", "mistral", "qwen2", "t5", "bart",
           "vit", "deit", "swin", "convnext", "resnet", "clip", "whisper", "wav2vec2",
           "deberta-v2", "segformer", "dpt", "beit", "mobilevit", "albert", "electra", "opt",
           "gpt_neox", "phi", "falcon", "mpnet", "xlm-roberta", "deberta", "gemma", "qwen3",
           "mobilebert", "squeezebert", "layoutlm", "regnet", "efficientnet", "mobilenet_v2",
           "levit", "poolformer", "hubert", "wavlm", "mt5", "marian", "pegasus", "mbart",
           "bloom", "gptj", "codegen", "phi3", "stablelm", "starcoder2", "dinov2", "vit_mae",
           "data2vec-vision", "convnextv2", "swinv2", "yolos", "detr", "funnel", "ibert",
           "camembert", "xlnet", "longformer", "big_bird", "nystromformer", "rembert", "canine")
#: Example sizes: tokens per text input, samples per raw-audio input, the side of an image
#: whose config names none. Small, so a model builds in seconds on two cores.
SEQ, AUDIO_SAMPLES, IMAGE_SIDE = 8, 4000, 64
#: The shrunk config: integer attributes by name -> their small value.
LAYERS = ("num_hidden_layers", "num_layers", "encoder_layers", "decoder_layers", "n_layer",
          "n_layers", "num_encoder_layers", "num_decoder_layers")
WIDTHS = ("hidden_size", "d_model", "n_embd", "embed_dim", "dim", "d_embed")
HEADS = ("num_attention_heads", "encoder_attention_heads", "decoder_attention_heads", "n_head",
         "num_heads", "n_heads")
FFN = ("intermediate_size", "ffn_dim", "encoder_ffn_dim", "decoder_ffn_dim", "d_ff", "n_inner",
       "mlp_dim", "decoder_intermediate_size")
SMALL = {**dict.fromkeys(LAYERS, 2), **dict.fromkeys(WIDTHS, 64), **dict.fromkeys(HEADS, 4),
         **dict.fromkeys(FFN, 128), "num_key_value_heads": 2, "head_dim": 16, "d_kv": 16,
         "vocab_size": 1000, "image_size": 64, "max_source_positions": 100,
         "embedding_size": 64, "rotary_dim": 8,
         # video models' clips: two tubelets of VideoMAE's and ViViT's two frames
         "num_frames": 4,
         # multi-head latent attention (DeepSeek-V2/V3): the rotary part of a head is head_dim
         "qk_rope_head_dim": 16, "qk_nope_head_dim": 16, "v_head_dim": 16,
         "kv_lora_rank": 32, "q_lora_rank": 64,
         # DeepSeek's mixture of experts: 16 experts in its 8 groups, the first layer dense
         "n_routed_experts": 16, "moe_intermediate_size": 128, "first_k_dense_replace": 1,
         # Swin's windows: its last stage sees the small image's 16 x 16 patches as 2 x 2, and
         # a window larger than a stage's resolution shrinks but its position bias does not
         "window_size": 2,
         # group norms over the shrunk widths (BiT's bottlenecks narrow to 8 channels)
         "num_groups": 8}
#: Per-stage list attributes (stage depths, channel widths) and how they shrink.
LIST_DEPTHS = ("depths", "num_blocks", "encoder_layers_per_stage")
LIST_WIDTHS = ("hidden_sizes", "embed_dims", "dims", "channels", "widths")
#: The causes a failure is filed under, by the stage it failed in.
CAUSES = {"config": "config/inputs we could not make", "export": "export error",
          "onnx-export": "ONNX export error", "import": "importer error",
          "compile": "build error", "load": "load error", "verify": "numeric mismatch",
          "crash": "crash/timeout"}
LOWERING = "op without lowering"
#: A verify failure where torch.export's program differs from eager PyTorch and the build follows
#: the program (tvmfuse.verify says so): the export, not tvmfuse, lost the computation.
EXPORT_DIFFERS = "torch.export's program differs from eager"
#: A verify failure where PyTorch itself, run in the build's precision, has the same NaN or Inf
#: (tvmfuse.verify says so): the small config's values overflow or vanish in float16.
PEER_NONFINITE = "NaN/Inf in PyTorch at that precision too"


# --- one model: config, inputs, module ------------------------------------------------------


def model_types() -> list[str]:
    """Every model type of the AutoModel mapping, the popular ones first."""
    from transformers.models.auto.modeling_auto import MODEL_MAPPING_NAMES  # noqa: PLC0415

    popular = [t for t in POPULAR if t in MODEL_MAPPING_NAMES]
    return popular + sorted(set(MODEL_MAPPING_NAMES) - set(popular))


def shrink(config, seen=None) -> None:
    """Shrink ``config`` (and the configs it holds: text, vision, encoder, ...) in place."""
    from transformers import PretrainedConfig  # noqa: PLC0415

    seen = seen if seen is not None else set()
    if id(config) in seen:
        return
    seen.add(id(config))
    attrs = config.__dict__
    for name, value in list(attrs.items()):
        if isinstance(value, PretrainedConfig):
            shrink(value, seen)
        elif isinstance(value, dict) and name.endswith("_config") and "model_type" in value:
            sub = type(config).sub_configs.get(name) if hasattr(config, "sub_configs") else None
            if sub is not None:
                made = sub(**value)
                shrink(made, seen)
                setattr(config, name, made)
        elif isinstance(value, bool):
            continue
        elif isinstance(value, int) and name in WIDTHS and value > SMALL[name]:
            setattr(config, name, _width(attrs))
        elif isinstance(value, int) and name in SMALL and value > SMALL[name]:
            setattr(config, name, SMALL[name])
        elif _int_list(value) and name in LIST_DEPTHS:
            setattr(config, name, [1] * len(value))
        elif _int_list(value) and name in LIST_WIDTHS and max(value) > 256:
            factor = 1 << (max(value) // 256).bit_length() - 1
            if all(v % factor == 0 for v in value):
                setattr(config, name, type(value)(v // factor for v in value))
        elif isinstance(value, (list, tuple)) and len(value) == 2 and name == "image_size":
            setattr(config, name, [min(v, SMALL["image_size"]) for v in value])
    layers = next((attrs[n] for n in LAYERS if isinstance(attrs.get(n), int)), None)
    if isinstance(attrs.get("layer_types"), list) and layers is not None:
        config.layer_types = config.layer_types[:layers]
    vocab = attrs.get("vocab_size")
    for name, value in list(attrs.items()):  # token ids must stay inside the vocabulary
        if name.endswith("token_id") and isinstance(value, int) and vocab and value >= vocab:
            setattr(config, name, vocab - 1)
    if "qk_head_dim" in attrs:  # multi-head latent attention: derived in __init__, and the
        config.qk_head_dim = config.qk_nope_head_dim + config.qk_rope_head_dim  # latent keys
        config.num_key_value_heads = config.num_attention_heads  # expand to every head
    if "num_experts_per_tok" in attrs and attrs["num_experts_per_tok"] is None:
        config.num_experts_per_tok = 2  # DeepSeek-V2's default leaves its top-k unset
    if "use_cache" in attrs:
        config.use_cache = False


def _width(attrs: dict) -> int:
    """The small width: 64, or 16 per head where the first stage's head count does not divide
    64 (Swin's 3, 6, 12, 24 heads over widths that double per stage)."""
    heads = next((attrs[n] for n in HEADS if n in attrs), None)
    first = min(heads, SMALL["num_attention_heads"]) if isinstance(heads, int) else (
        heads[0] if _int_list(heads) else 1)
    return SMALL["hidden_size"] if SMALL["hidden_size"] % max(first, 1) == 0 else 16 * first


def _int_list(value) -> bool:
    return isinstance(value, (list, tuple)) and bool(value) and all(
        isinstance(v, int) and not isinstance(v, bool) for v in value)


def make_model(model_type: str):
    """``(module, input names, input tensors, config class name)``: the small model, wrapped to
    take its inputs positionally and return the first tensor of its output."""
    import torch  # noqa: PLC0415
    from transformers import CONFIG_MAPPING, AutoModel  # noqa: PLC0415

    config = CONFIG_MAPPING[model_type]()
    shrink(config)
    torch.manual_seed(SEED)
    model = AutoModel.from_config(config).eval()
    _vary_constant_weights(model)
    names, tensors = make_inputs(model, config)
    module = FirstOutput.wrap(model, names)
    with torch.no_grad():  # a config or inputs the model refuses fail here, not in the export
        output = module(*tensors)
        if output is None:
            raise ValueError(f"{type(model).__name__} returned no tensor")
        if output.is_floating_point() and float(output.abs().max()) < VANISHED:
            _rescale_weights(model)
            _calibrate_batch_norms(module, tensors)
    return module, names, tensors, type(config).__name__


#: An output whose largest magnitude is below this has vanished through the layers: MobileViT's
#: small config, at its initializer's std of 0.02 without normalization between its convs,
#: ends at 1e-40, where float32 is subnormal and a compiler that flushes subnormals to zero (as
#: LLVM's fast math does) differs from PyTorch by 100%.
VANISHED = 1e-20


def _rescale_weights(model) -> None:
    """Draw every weight matrix and kernel again at the scale that keeps activations near one
    (normal, std 1/sqrt(fan-in)), for a model whose output vanished (see VANISHED)."""
    import torch  # noqa: PLC0415

    generator = torch.Generator().manual_seed(SEED)
    with torch.no_grad():
        for param in model.parameters():
            if param.dim() >= 2 and param.is_floating_point():
                fan_in = param[0].numel()
                param.copy_(torch.randn(param.shape, generator=generator) / fan_in ** 0.5)


def _calibrate_batch_norms(module, tensors) -> None:
    """Set every BatchNorm's running statistics to those of ``tensors``' activations (one
    forward pass in training mode), as training leaves them: at their initial mean 0 and
    variance 1, EfficientNet's small config shrinks its activations at every squeeze-excite
    block, to 1e-44 at the output (float32 subnormals, which LLVM's fast math flushes to zero)."""
    import torch  # noqa: PLC0415

    norms = [m for m in module.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    if not norms:
        return
    for norm in norms:
        norm.momentum = None  # a cumulative average: after one pass, that pass's statistics
        norm.reset_running_stats()
        norm.train()
    with torch.no_grad():
        module(*tensors)
    for norm in norms:
        norm.eval()


def _vary_constant_weights(model) -> None:
    """Give each weight matrix that its initializer left constant (AFMoE's router, zeros), or
    drew below float16's smallest normal value (BLIP's vision tower: std 1e-10), seeded values
    of the scale transformers draws others at: a constant router scores every expert alike, and
    which of the tied experts a top-k picks is the implementation's choice, so the outputs of two
    correct implementations differ; a zero weight also hides a wrong op, and a float16 build
    (PyTorch's too) reads 1e-10 as zero."""
    import torch  # noqa: PLC0415

    generator = torch.Generator().manual_seed(SEED)
    with torch.no_grad():
        for param in model.parameters():
            if param.dim() >= 2 and param.is_floating_point() and param.numel() > 1 and (
                    bool(param.min() == param.max())
                    or float(param.abs().max()) < FLOAT16_SMALLEST_NORMAL):
                param.copy_(torch.randn(param.shape, generator=generator) * 0.02)


#: float16's smallest normal magnitude (2**-14): below it a weight loses its precision, and
#: below 2**-24 it is zero.
FLOAT16_SMALLEST_NORMAL = 2.0 ** -14


def _text_config(config):
    for name in ("text_config", "decoder", "text_encoder"):
        sub = getattr(config, name, None)
        if sub is not None and getattr(sub, "vocab_size", None):
            return sub
    return config


def _vision_config(config):
    sub = getattr(config, "vision_config", None)
    return sub if sub is not None else config


def make_inputs(model, config) -> tuple[list[str], list]:
    """The model's inputs by name, drawn from its ``main_input_name`` and config."""
    import torch  # noqa: PLC0415

    generator = torch.Generator().manual_seed(SEED)
    params = inspect.signature(model.forward).parameters
    main = model.main_input_name
    text = _text_config(config)
    vocab = getattr(text, "vocab_size", None) or 1000

    def tokens():
        return torch.randint(0, vocab, (1, SEQ), generator=generator)

    inputs = {}
    if main == "input_ids" or "input_ids" in params and main not in (
            "pixel_values", "input_values", "input_features"):
        inputs["input_ids"] = tokens()
        if "attention_mask" in params:
            inputs["attention_mask"] = torch.ones(1, SEQ, dtype=torch.long)
    if main in ("pixel_values", "pixel_values_videos") or "pixel_values" in params and \
            "input_ids" in inputs:
        vision = _vision_config(config)
        side = getattr(vision, "image_size", IMAGE_SIDE)
        height, width = (side, side) if isinstance(side, int) else tuple(side)[:2]
        channels = getattr(vision, "num_channels", 3)
        frames = getattr(vision, "num_frames", None)  # a video model: (batch, frames, C, H, W)
        shape = (1, channels, height, width) if frames is None else \
            (1, frames, channels, height, width)
        name = "pixel_values_videos" if main == "pixel_values_videos" else "pixel_values"
        inputs[name] = torch.randn(*shape, generator=generator)
    if main == "past_values" and getattr(config, "context_length", None):  # time series
        channels = getattr(config, "num_input_channels", None)
        shape = (1, config.context_length) + ((channels,) if channels else ())
        inputs["past_values"] = torch.randn(*shape, generator=generator)
    if main == "input_values":
        inputs["input_values"] = torch.randn(1, AUDIO_SAMPLES, generator=generator)
    if main == "input_features":
        bins = getattr(config, "num_mel_bins", None) or getattr(config, "feature_size", 80)
        frames = 2 * getattr(config, "max_source_positions", 50)
        inputs["input_features"] = torch.randn(1, bins, frames, generator=generator)
    if not inputs:
        raise ValueError(f"no inputs made for main input {main!r}")
    if "noise" in params and "pixel_values" in inputs:  # ViT-MAE masks patches by this noise,
        vision = _vision_config(config)  # drawn with torch.rand where it is not given
        patches = (inputs["pixel_values"].shape[-1] // vision.patch_size) ** 2
        inputs["noise"] = torch.rand(1, patches, generator=generator)
    if "decoder_input_ids" in params and getattr(config, "is_encoder_decoder", False):
        inputs["decoder_input_ids"] = tokens()
    return list(inputs), list(inputs.values())


def first_tensor(output):
    """The first tensor in a model's output (a ModelOutput, a tuple, or a tensor)."""
    import torch  # noqa: PLC0415

    if isinstance(output, torch.Tensor):
        return output
    values = output.to_tuple() if hasattr(output, "to_tuple") else output
    for value in values if isinstance(values, (tuple, list)) else ():
        found = first_tensor(value)
        if found is not None:
            return found
    return None


class FirstOutput:
    """Builds an ``nn.Module`` whose ``forward`` takes the inputs positionally, under their
    names (tvmfuse names a module's inputs from the signature), and returns one tensor."""

    @staticmethod
    def wrap(model, names: list[str]):
        import torch  # noqa: PLC0415

        def forward(self, *tensors):
            return first_tensor(self.model(**dict(zip(self.names, tensors))))

        positional = inspect.Parameter.POSITIONAL_OR_KEYWORD
        forward.__signature__ = inspect.Signature(
            [inspect.Parameter(n, positional) for n in ("self", *names)])

        def init(self):
            torch.nn.Module.__init__(self)
            self.model, self.names = model, names

        cls = type("FirstOutput", (torch.nn.Module,), {"__init__": init, "forward": forward})
        return cls().eval()


# --- the stages -----------------------------------------------------------------------------


class StageError(Exception):
    """A stage failed: which one, and its first error line."""

    def __init__(self, stage: str, err: BaseException):
        super().__init__(first_line(err))
        self.stage = stage


def first_line(err: BaseException) -> str:
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(err))  # torch.onnx colours its messages
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return f"{type(err).__name__}: {lines[0] if lines else ''}"[:400]


def stage(name: str, work, *args, **kwargs):
    """``work(*args, **kwargs)``, its error raised as a StageError of stage ``name``."""
    try:
        return work(*args, **kwargs)
    except StageError:
        raise
    except Exception as err:  # noqa: BLE001 - any error of the model or the compiler is a result
        raise StageError(name, err) from err


def export_torch(module, tensors) -> None:
    """``torch.export`` the module: the program tvmfuse imports is made the same way."""
    import torch  # noqa: PLC0415

    with torch.no_grad():
        torch.export.export(module, tuple(tensors))


def export_onnx(module, names, tensors, path: Path) -> None:
    """``torch.onnx.export`` the module, mixture-of-experts layers in the form tvmfuse's own
    torch.export takes (:func:`tvmfuse.frontend.batched_experts`; the default form's custom op
    has no ONNX export)."""
    import torch  # noqa: PLC0415

    from tvmfuse.frontend import batched_experts  # noqa: PLC0415

    with torch.no_grad(), batched_experts(module):
        torch.onnx.export(module, tuple(tensors), str(path), input_names=names,
                          output_names=["output"], dynamo=True, verbose=False)


def build_and_verify(model, out_dir: Path, target: str | None, dtype: str) -> None:
    """Compile ``model`` for ``target`` (default: this CPU) without tuning records, build it,
    and verify it."""
    from tvmfuse import api  # noqa: PLC0415
    from tvmfuse.cli.common import DTYPES  # noqa: PLC0415
    from tvmfuse.verify import verify  # noqa: PLC0415

    compiled = stage("compile", api.compile_model, model, api.get_target(target),
                     api.BuildOptions(use_database=False, dtype=DTYPES[dtype]))

    def check(staged: Path) -> None:
        stage("verify", verify, stage("load", api.load, staged), model)

    api.build(compiled, out_dir, check=check)


def run_path(model_type: str, path: str, scratch: Path, target: str | None = None,
             dtype: str = "fp32") -> dict:
    """One path (``torch`` or ``onnx``) of one model type, in this process."""
    from tvmfuse import api  # noqa: PLC0415

    result = {"exported": False, "built": False, "verified": False}
    try:
        module, names, tensors, config_class = stage("config", make_model, model_type)
        result["config_class"] = config_class
        if path == "torch":
            stage("export", export_torch, module, tensors)
            result["exported"] = True
            imported = stage("import", lambda: api.import_torch(module, tensors, name=model_type))
        else:
            onnx_file = scratch / f"{model_type}.onnx"
            stage("onnx-export", export_onnx, module, names, tensors, onnx_file)
            result["exported"] = True
            imported = stage("import", api.import_model, str(onnx_file))
        try:
            build_and_verify(imported, scratch / f"{model_type}-{path}", target, dtype)
        except StageError as err:
            result["built"] = err.stage in ("load", "verify")
            raise
        result["built"] = result["verified"] = True
    except StageError as err:
        result.update(stage=err.stage, error=str(err))
    return result


# --- causes and the sweep -------------------------------------------------------------------


def cause_of(result: dict) -> str | None:
    """The cause group of a failed path; None when it verified."""
    if result.get("verified"):
        return None
    error, stage_name = result.get("error", ""), result.get("stage", "crash")
    op = lowering_op(error)
    if op is not None and stage_name in ("import", "compile"):
        return f"{LOWERING}: {op}"
    if stage_name == "verify" and "torch.export's own program" in error:
        return EXPORT_DIFFERS
    if stage_name == "verify" and "does not compute in this precision" in error:
        return PEER_NONFINITE
    return CAUSES.get(stage_name, stage_name)


def lowering_op(error: str) -> str | None:
    """The op an error says has no lowering or no converter, else None."""
    for pattern in (r"no lowering for ([\w.]+)", r"Unsupported function types? \[?'?([\w.]+)",
                    r"No converter for ([\w.]+)", r"not supported[^:]*: '?([\w.]+)",
                    r"Unsupported ops?:? \[?'?([\w.]+)"):
        match = re.search(pattern, error)
        if match:
            return match.group(1)
    return None


def sweep_one(model_type: str, timeout: float, paths=("torch", "onnx"), target: str | None = None,
              dtype: str = "fp32") -> dict:
    """The paths of one model type, each in its own process under ``timeout`` seconds."""
    record = {"type": model_type, "commit": commit()}
    for path in paths:
        command = [sys.executable, __file__, "--worker", model_type, "--path", path,
                   "--dtype", dtype] + (["--target", target] if target else [])
        try:
            done = subprocess.run(command, cwd=REPO, capture_output=True, text=True,
                                  timeout=timeout)
            lines = done.stdout.strip().splitlines()
            if done.returncode == 0 and lines:
                result = json.loads(lines[-1])
            else:
                tail = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
                result = {"exported": False, "built": False, "verified": False, "stage": "crash",
                          "error": f"exit {done.returncode}: {tail}"[:400]}
        except subprocess.TimeoutExpired:
            result = {"exported": False, "built": False, "verified": False, "stage": "crash",
                      "error": f"timed out after {timeout:.0f} s"}
        record.setdefault("config_class", result.pop("config_class", None))
        result.pop("config_class", None)
        result["cause"] = cause_of(result)
        record[path] = result
    return record


def summary(records: list[dict]) -> str:
    """The counts and the failure causes, largest group first, as a text table."""
    lines = []
    for path in ("torch", "onnx"):
        results = [r[path] for r in records if path in r]
        if not results:
            continue
        counts = [sum(r[k] for r in results) for k in ("exported", "built", "verified")]
        lines.append(f"{path}: {len(results)} model types, {counts[0]} exported, {counts[1]} "
                     f"built, {counts[2]} verified")
        groups = defaultdict(list)
        for record in records:
            if path in record and record[path]["cause"]:
                groups[record[path]["cause"]].append(record["type"])
        for cause, types in sorted(groups.items(), key=lambda item: -len(item[1])):
            lines.append(f"  {len(types):4d}  {cause:48s}  {', '.join(types[:6])}")
    return "\n".join(lines)


def write(out: Path, kind: str, reproduce: str, records: list[dict], target: str | None = None,
          dtype: str = "fp32") -> None:
    causes = Counter(r[p]["cause"] for r in records for p in ("torch", "onnx")
                     if p in r and r[p]["cause"])
    out.parent.mkdir(parents=True, exist_ok=True)
    staged = out.with_suffix(".json.partial")  # a sweep killed mid-write keeps the last JSON
    staged.write_text(json.dumps({"machine": kind, "commit": commit(), "commit_is": "measured",
                                  "reproduce": reproduce, "target": target or "this CPU",
                                  "dtype": dtype, "causes": dict(causes.most_common()),
                                  "coverage": records}, indent=1) + "\n")
    staged.replace(out)


def in_sweep_order(records) -> list[dict]:
    """``records`` in the order the sweep takes their model types (:func:`model_types`)."""
    order = {model_type: index for index, model_type in enumerate(model_types())}
    return sorted(records, key=lambda r: order.get(r["type"], len(order)))


def merge(out: Path, kind: str, parts: list[Path], target: str | None, dtype: str) -> int:
    """File the records of ``parts`` into ``out`` by model type (a part's record replaces the one
    ``out`` held), in the sweep's order, and print the summary."""
    held = json.loads(out.read_text()) if out.exists() else {"reproduce": "", "coverage": []}
    by_type = {r["type"]: r for r in held["coverage"]}
    for part in parts:
        by_type.update((r["type"], r) for r in json.loads(part.read_text())["coverage"])
    records = in_sweep_order(by_type.values())
    write(out, kind, held["reproduce"], records, target, dtype)
    print(summary(records))
    print(f"wrote {out}: {len(records)} model types")
    return 0


def worker(model_type: str, path: str, target: str | None, dtype: str) -> int:
    """The ``--worker`` process: one path of one model, its result as the last stdout line."""
    import logging  # noqa: PLC0415
    import warnings  # noqa: PLC0415

    logging.disable(logging.WARNING)
    warnings.filterwarnings("ignore")
    with tempfile.TemporaryDirectory(prefix="tvmfuse-coverage-") as scratch:
        try:
            result = run_path(model_type, path, Path(scratch), target, dtype)
        except Exception as err:  # noqa: BLE001 - outside every stage: still one result
            traceback.print_exc()
            result = {"exported": False, "built": False, "verified": False, "stage": "crash",
                      "error": first_line(err)}
    print(json.dumps(result), flush=True)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", help="comma-separated model types (default: all)")
    parser.add_argument("--offset", type=int, default=0, help="skip the first N model types")
    parser.add_argument("--limit", type=int, help="sweep at most N model types")
    parser.add_argument("--resume", action="store_true",
                        help="keep the model types the JSON holds and sweep the others")
    parser.add_argument("--timeout", type=float, default=120,
                        help="seconds per model and path (default 120)")
    parser.add_argument("--kind", help="machine kind the results are filed under")
    parser.add_argument("--json", type=Path,
                        help="default: benchmarks/results/<kind>/coverage.json")
    parser.add_argument("--target", help="tvmfuse's target name (default: this CPU)")
    parser.add_argument("--dtype", default="fp32", help="the builds' precision (default fp32)")
    parser.add_argument("--paths", default="torch,onnx",
                        help="comma-separated: torch, onnx (default both)")
    parser.add_argument("--jobs", type=int, default=1, help="model types swept at a time")
    parser.add_argument("--exported-in", type=Path, metavar="JSON",
                        help="sweep only the model types this sweep's JSON exported through "
                             "torch.export (the GPU sweep skips those that fail before a build)")
    parser.add_argument("--merge", type=Path, nargs="+", metavar="PART",
                        help="file these sweeps' records into the JSON by type, then exit")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--path", choices=("torch", "onnx"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args.worker, args.path, args.target, args.dtype)

    sys.path.insert(0, str(REPO / "benchmarks"))
    from models import machine_kind  # noqa: PLC0415 - the kind as benchmarks/models.py names it

    types = model_types()
    if args.only:
        unknown = sorted(set(args.only.split(",")) - set(types))
        types = [t for t in types if t in args.only.split(",")]
        if unknown and not types:
            parser.error(f"not a model type of AutoModel: {', '.join(unknown)}")
        if unknown:  # a list from a newer transformers (the CPU sweep's, on the GPU host)
            print(f"skipping {len(unknown)} model types this transformers does not have: "
                  f"{', '.join(unknown)}", file=sys.stderr)
    if args.exported_in:
        exported = {r["type"] for r in json.loads(args.exported_in.read_text())["coverage"]
                    if r.get("torch", {}).get("exported")}
        types = [t for t in types if t in exported]
    types = types[args.offset:][:args.limit]
    kind = args.kind or machine_kind()
    out = args.json or REPO / "benchmarks" / "results" / kind / "coverage.json"
    if args.merge:
        return merge(out, kind, args.merge, args.target, args.dtype)
    records = json.loads(out.read_text())["coverage"] if args.resume and out.exists() else []
    done = {r["type"] for r in records}
    reproduce = shlex.join(["python", "benchmarks/coverage.py", *sys.argv[1:]])
    paths = tuple(args.paths.split(","))
    todo = [t for t in types if t not in done]
    with ThreadPoolExecutor(args.jobs) as pool:  # each path runs in a process of its own
        sweeps = [pool.submit(sweep_one, model_type, args.timeout, paths, args.target, args.dtype)
                  for model_type in todo]
        # each record written as soon as its sweep ends, so a killed run keeps every finished one
        for index, done_sweep in enumerate(as_completed(sweeps)):
            record = done_sweep.result()
            print(f"[{index + 1}/{len(todo)}] {record['type']}", flush=True)
            for path in paths:
                result = record[path]
                print(f"  {path}: " + ("verified" if result["verified"] else result["error"]),
                      flush=True)
            records = in_sweep_order([*records, record])
            write(out, kind, reproduce, records, args.target, args.dtype)
    print(summary(records))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""tvmfuse's own Relax passes, one per file (verb_object.py holds VerbObject)."""

from .apply_database import ApplyDatabase
from .apply_schedule_rules import ApplyScheduleRules
from .compare_booleans_as_integers import CompareBooleansAsIntegers
from .conv1d_as_conv2d import Conv1DAsConv2D
from .decompose_clip import DecomposeClip
from .drop_unused_shape_casts import DropUnusedShapeCasts
from .einsum_as_matmul import EinsumAsMatmul
from .expand_integer_power import ExpandIntegerPower
from .fold_batch_norm import FoldBatchNorm
from .fold_constant_casts import FoldConstantCasts
from .fold_constants_in_numpy import FoldConstantsInNumPy, FoldRemainingConstants
from .fold_creation_ops import FoldCreationOps
from .fold_gelu_tanh import FoldGeluTanh
from .fold_layout_glue import FoldLayoutGlue
from .fold_matmul_reshape import FoldMatmulReshape
from .fold_pad_into_conv import FoldPadIntoConv
from .fuse_attention import FuseAttention
from .global_pool_to_reduce import GlobalPoolToReduce
from .group_norm_as_layer_norm import GroupNormAsLayerNorm
from .mark_gathers_injective import MarkGathersInjective
from .mark_weights_layout_free import MarkWeightsLayoutFree
from .merge_parallel_matmul import MergeParallelMatmul
from .merge_summed_conv import MergeSummedConv
from .narrow_to_bfloat16 import NarrowToBFloat16
from .normalize_negative_axes import NormalizeNegativeAxes
from .pad_conv_channels import PadConvChannels
from .point_conv_as_matmul import PointConvAsMatmul
from .prepack_weights import PrepackWeights
from .quantize_int8 import ObserveQuantized, QuantizeInt8
from .select_in_float32 import SelectInFloat32
from .simplify_bounded_shapes import SimplifyBoundedShapes
from .slice_scatter_as_concat import SliceScatterAsConcat
from .space_to_depth_conv import SpaceToDepthConv
from .stack_as_concat import StackAsConcat
from .store_narrowed import StoreNarrowed
from .transposed_conv_as_conv import TransposedConvAsConv
from .use_wgmma_gemms import UseWgmmaGemms
from .verify_fusion import VerifyFusion
from .widen_elementwise import WidenElementwise
from .widen_epilogues import WidenEpilogues
from .widen_integer_cumsum import WidenIntegerCumsum
from .winograd_conv2d import WinogradConv2D

__all__ = ["ApplyDatabase", "ApplyScheduleRules", "CompareBooleansAsIntegers", "Conv1DAsConv2D",
           "DecomposeClip", "DropUnusedShapeCasts", "EinsumAsMatmul", "ExpandIntegerPower",
           "FoldBatchNorm", "FoldConstantCasts", "FoldConstantsInNumPy", "FoldCreationOps",
           "FoldGeluTanh", "FoldLayoutGlue", "FoldMatmulReshape", "FoldPadIntoConv",
           "FoldRemainingConstants",
           "FuseAttention", "GlobalPoolToReduce", "GroupNormAsLayerNorm", "MarkGathersInjective",
           "MarkWeightsLayoutFree", "MergeParallelMatmul", "MergeSummedConv", "NarrowToBFloat16",
           "NormalizeNegativeAxes", "ObserveQuantized", "PadConvChannels", "PointConvAsMatmul",
           "PrepackWeights", "QuantizeInt8", "SelectInFloat32", "SimplifyBoundedShapes",
           "SliceScatterAsConcat", "SpaceToDepthConv", "StackAsConcat", "StoreNarrowed",
           "TransposedConvAsConv", "UseWgmmaGemms", "VerifyFusion", "WidenElementwise",
           "WidenEpilogues", "WidenIntegerCumsum", "WinogradConv2D"]

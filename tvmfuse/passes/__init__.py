"""tvmfuse's own Relax passes, one per file (verb_object.py holds VerbObject)."""

from .fold_batch_norm import FoldBatchNorm
from .fold_matmul_reshape import FoldMatmulReshape
from .verify_fusion import VerifyFusion

__all__ = ["FoldBatchNorm", "FoldMatmulReshape", "VerifyFusion"]

"""Hand-written kernels for CUDA GPUs (schedule rules on GPUs are dlight's; see
:mod:`tvmfuse.strategy`)."""

from . import math_intrinsics  # noqa: F401 - registers the CUDA lowerings TVM lacks (acos, ...)

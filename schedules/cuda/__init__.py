"""Hand-written kernels for CUDA GPUs (schedule rules on GPUs are dlight's; see
:mod:`tvmfuse.strategy`)."""

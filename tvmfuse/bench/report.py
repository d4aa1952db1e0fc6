"""The `tvmfuse bench` report: one line per engine, ratios to the best peer, GFLOP/s and the
share of the machine's peak (the JSON schema of ``tvmfuse bench --json``)."""

from __future__ import annotations

from dataclasses import dataclass, field

#: tvmfuse's own engines: not peers (``tvmfuse-unfused`` is tvmfuse with its fusion rules off,
#: the same layouts and schedules: what fusion alone is worth).
OWN = ("tvmfuse", "tvmfuse-unfused")


@dataclass
class Result:
    """One engine's line in the report (the JSON schema of ``results``)."""

    engine: str
    median_ms: float
    min_ms: float
    max_ms: float
    runs: int
    setup_s: float
    rel_err: float | None
    kernels: int | None
    ratio_to_best_peer: float | None = None
    gflops: float | None = None
    fraction_of_peak: float | None = None
    #: The precision it computed in: the bench's, but OpenVINO's own (bf16 where the CPU has
    #: AVX-512 BF16) for ``openvino`` and int8 for ``onnxruntime-int8``.
    precision: str | None = None
    #: Quantized engines against the float32 reference on seeded inputs: ``{"top1": share}``
    #: on a classifier's logits, ``{"cosine": mean}`` on other outputs.
    agreement: dict[str, float] | None = None

    def to_json(self) -> dict:
        return dict(self.__dict__)


@dataclass
class Report:
    model: str
    target: str
    threads: int
    batch: int | None
    dtype: str
    flops: float | None
    peak_gflops: float | None
    results: list[Result] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)
    command: str = ""
    #: How runs were timed: "wall-clock" (host) or "cuda-events" (the GPU's clock).
    timer: str = "wall-clock"

    def finish(self) -> None:
        """Fill in the ratios to the best peer (every engine but tvmfuse's own) and GFLOP/s."""
        peers = [r.median_ms for r in self.results if r.engine not in OWN]
        best = min(peers) if peers else None
        for r in self.results:
            r.ratio_to_best_peer = r.median_ms / best if best else None
            if self.flops:
                r.gflops = self.flops / r.median_ms / 1e6
                if self.peak_gflops:
                    r.fraction_of_peak = r.gflops / self.peak_gflops

    def to_json(self) -> dict:
        data = {k: v for k, v in self.__dict__.items() if k != "results"}
        data["results"] = [r.to_json() for r in self.results]
        return data

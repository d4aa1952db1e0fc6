"""Tensor specs shared by the compiler and the runtime: names, shapes (symbolic dims as strings)
and dtypes, as written in a build's ``manifest.json``. No torch or TVM imports here."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from .errors import TvmfuseError

#: Seed of every random weight and example input, so builds and references agree.
SEED = 0
#: The seeds of the inputs an int8 calibration draws where it is given none (the first draws
#: the examples), as ONNX Runtime's int8 peer in `tvmfuse bench` does: min-max ranges over a few
#: draws of one distribution, which more draws only widen.
CALIBRATION_SEEDS = range(SEED, SEED + 8)
#: The seeds, after the calibration's, of the inputs an int8 build's agreement with its
#: reference is judged on (``--verify``, `tvmfuse bench`).
AGREEMENT_SEEDS = range(CALIBRATION_SEEDS.stop, CALIBRATION_SEEDS.stop + 100)

#: The dynamic dimensions ``--dynamic`` understands: name -> its axis in every input that has
#: it (``seq``: integer inputs of two or more dimensions, token ids ``[batch, seq]``).
DYNAMIC_DIMS = {"batch": 0, "seq": 1}


@dataclass(frozen=True)
class TensorSpec:
    """One model input or output. A ``str`` dimension is symbolic (``"batch"``)."""

    name: str
    shape: tuple[int | str, ...]
    dtype: str

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "shape": list(self.shape), "dtype": self.dtype}

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> TensorSpec:
        return cls(obj["name"], tuple(obj["shape"]), obj["dtype"])

    def check(self, array: np.ndarray) -> None:
        """Raise a TvmfuseError naming this input when ``array`` does not fit the spec."""
        if str(array.dtype) != self.dtype:
            raise TvmfuseError(
                f"input {self.name!r} has dtype {array.dtype}, the model expects {self.dtype}"
            )
        fits = len(array.shape) == len(self.shape) and all(
            isinstance(want, str) or want == got for want, got in zip(self.shape, array.shape)
        )
        if not fits:
            raise TvmfuseError(
                f"input {self.name!r} has shape {tuple(array.shape)}, the model expects "
                f"{format_shape(self.shape)}"
            )


def format_shape(shape: tuple[int | str, ...]) -> str:
    return "(" + ", ".join(str(d) for d in shape) + ")"


def parse_shape(text: str) -> tuple[tuple[int, ...], str | None]:
    """Parse ``--input-shape`` text: ``1,3,224,224`` or ``1,128:int64`` (shape, optional dtype)."""
    dims, _, dtype = text.partition(":")
    try:
        shape = tuple(int(d) for d in dims.replace("x", ",").split(",") if d.strip())
    except ValueError:
        raise TvmfuseError(
            f"cannot read input shape {text!r}; write it as 1,3,224,224 (optionally :dtype)"
        ) from None
    if not shape or any(d <= 0 for d in shape):
        raise TvmfuseError(f"input shape {text!r} must list positive dimensions, e.g. 1,3,224,224")
    if dtype:
        try:
            np.dtype(dtype)
        except TypeError:
            raise TvmfuseError(f"unknown dtype {dtype!r} in input shape {text!r}") from None
    # the example input of this shape is made in memory: refuse one larger than the machine's
    size = math.prod(shape) * (np.dtype(dtype).itemsize if dtype else 4)
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    if size > memory:
        raise TvmfuseError(f"input shape {text!r} is {size / 2**30:.3g} GiB, more than this "
                           f"machine's memory ({memory / 2**30:.3g} GiB); give smaller dimensions")
    return shape, dtype or None


def symbolic_sizes(specs, arrays) -> dict[str, tuple[str, int]]:
    """Each symbolic dimension of ``specs`` -> (the first input that has it, its size in
    ``arrays``); a TvmfuseError where two inputs give it different sizes."""
    sizes = {}
    for spec, array in zip(specs, arrays):
        for want, got in zip(spec.shape, array.shape):
            if not isinstance(want, str):
                continue
            other, size = sizes.setdefault(want, (spec.name, int(got)))
            if size != got:
                raise TvmfuseError(f"inputs {other!r} and {spec.name!r} have {want} {size} and "
                                   f"{got}; they share one {want}")
    return sizes


def check_dynamic(dynamic, max_seq: int | None) -> None:
    """Raise a TvmfuseError when the ``--dynamic`` dimensions and ``--max-seq`` do not go
    together."""
    unknown = sorted(set(dynamic) - set(DYNAMIC_DIMS))
    if unknown:
        raise TvmfuseError(
            f"unknown dynamic dimension {unknown[0]!r}; supported: {', '.join(DYNAMIC_DIMS)}"
        )
    if "seq" in dynamic and max_seq is None:
        raise TvmfuseError("--dynamic seq needs --max-seq N, the longest sequence the build "
                           "will run (its memory is planned for it)")
    if max_seq is not None and "seq" not in dynamic:
        raise TvmfuseError("--max-seq bounds a dynamic sequence: add --dynamic seq")
    if max_seq is not None and max_seq < 2:
        raise TvmfuseError(f"--max-seq must be at least 2, not {max_seq}")


def random_inputs(specs, value_ranges=None, seed: int = SEED, sizes=None) -> list[np.ndarray]:
    """Seeded random inputs for ``specs``, symbolic dims at ``sizes`` (name -> size; 1 where it
    names none); integers within ``value_ranges``."""
    rng = np.random.default_rng(seed)
    arrays = []
    for spec in specs:
        shape = tuple((sizes or {}).get(d, 1) if isinstance(d, str) else d for d in spec.shape)
        low, high = (value_ranges or {}).get(spec.name, (0, 2))
        drawn = np.issubdtype(np.dtype(spec.dtype), np.floating)
        if drawn and spec.name not in (value_ranges or {}):
            arrays.append(rng.standard_normal(shape).astype(spec.dtype))
        else:
            arrays.append(rng.integers(low, high, shape).astype(spec.dtype))
    return arrays

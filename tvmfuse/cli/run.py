"""``tvmfuse run``: run a built library with the TVM runtime alone (no torch), here or on a device
through TVM's RPC tracker, and save its outputs; ``--check`` compares them with the reference
outputs saved at build time."""

from __future__ import annotations

import argparse
import logging
import math
import sys
from pathlib import Path

import numpy as np

from ..errors import TvmfuseError
from .common import add_rpc_argument, check_rpc, nonnegative_int

log = logging.getLogger(__name__)


def add_parser(sub) -> None:
    parser = sub.add_parser("run", help="run a built library on inputs from .npy/.npz files",
                            description=__doc__)
    parser.add_argument("build_dir", type=Path, metavar="DIR",
                        help="a folder `tvmfuse build` wrote")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--input", action="append", type=Path, metavar="FILE",
                        help="a .npy file per input in order, or one .npz holding them by name")
    source.add_argument("--random", action="store_true",
                        help="run on seeded random inputs (symbolic dimensions as 1)")
    source.add_argument("--check", action="store_true",
                        help="run on the example inputs saved at build time and compare the "
                             "outputs with the reference's (PyTorch or ONNX Runtime)")
    add_rpc_argument(parser, "run (e.g. a board, or `tvmfuse arm-host up`)")
    parser.add_argument("-o", "--output", type=Path, default=Path("outputs.npz"), metavar="FILE",
                        help="where to write the outputs (.npz, by output name; a folder gets "
                             "outputs.npz; default outputs.npz)")
    parser.add_argument("--repeat", type=nonnegative_int, default=0, metavar="N",
                        help="also time N runs after a warm-up and log the median")
    parser.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    _without_torch()
    from ..bench.measure import time_deployed  # noqa: PLC0415 - TVM only after the arguments
    from ..runtime import load  # noqa: PLC0415

    output = _output_path(args.output)
    _check_output_is_new(output, args.build_dir, args.input or [])
    check_rpc(args.rpc)
    deployed = load(args.build_dir, args.rpc)
    if args.check:
        from ..verify import verify_saved  # noqa: PLC0415

        verify_saved(deployed)
        arrays = deployed.reference()[0]
    else:
        arrays = _random(deployed) if args.random else _read_inputs(args.input, deployed)
    outputs = deployed.run(arrays)
    np.savez(output, **{spec.name: out for spec, out in zip(deployed.outputs, outputs)})
    for spec, out in zip(deployed.outputs, outputs):
        log.info("%s: shape %s, dtype %s", spec.name, tuple(out.shape), out.dtype)
    log.info("wrote %s", output)
    if args.repeat > 0:
        latency = time_deployed(deployed, arrays, args.repeat)
        log.info("median %.3f ms over %d runs (min %.3f, max %.3f)", latency.median_ms,
                 args.repeat, latency.min_ms, latency.max_ms)
        if deployed.rpc is not None and _emulated(deployed.rpc):
            log.warning("measured on an emulator: these times say nothing about the device's "
                        "speed")
    return 0


def _output_path(path: Path) -> Path:
    """Where ``-o`` writes: ``path``, or ``path/outputs.npz`` for a folder; numpy would add
    ``.npz`` to any other name, so one is required."""
    if path.is_dir():
        path = path / "outputs.npz"
    elif path.suffix != ".npz":
        raise TvmfuseError(f"-o {path}: outputs are written as .npz; name a .npz file or a folder")
    if not path.parent.is_dir():
        raise TvmfuseError(f"-o {path}: folder {path.parent} does not exist")
    return path


def _check_output_is_new(output: Path, build_dir: Path, inputs: list[Path]) -> None:
    """Refuse an ``-o`` that would overwrite one of the inputs or a file of the build (its
    ``check.npz`` is the reference ``run --check`` compares with)."""
    from ..runtime import CHECK, LIBRARY, MANIFEST  # noqa: PLC0415

    for path in inputs:
        if _same_file(output, path):
            raise TvmfuseError(f"-o {output} is the input file {path}; write the outputs to "
                               f"another file")
    if build_dir.is_dir() and output.resolve().parent == build_dir.resolve() \
            and (output.exists() or output.name in (LIBRARY, MANIFEST, CHECK)):
        raise TvmfuseError(f"-o {output} is a file of the build in {build_dir}; write the "
                           f"outputs outside the build folder")


def _same_file(a: Path, b: Path) -> bool:
    if a.resolve() == b.resolve():
        return True
    try:
        return a.samefile(b)  # a hard link, or a link the paths above did not resolve alike
    except OSError:
        return False


def _emulated(rpc: str) -> bool:
    from ..remote import Remote  # noqa: PLC0415

    return Remote.parse(rpc).emulated


def _without_torch() -> None:
    """Make this process deploy as a device without PyTorch would.

    tvm_ffi imports torch whenever it is installed (for DLPack interop this path never uses);
    a ``None`` entry in ``sys.modules`` turns that import into the ImportError it tolerates.
    Only the CLI does this: the process is ours, so nothing else wants torch later.
    """
    if "torch" not in sys.modules:
        sys.modules["torch"] = None


def _random(deployed) -> list[np.ndarray]:
    from ..specs import random_inputs  # noqa: PLC0415

    try:
        return random_inputs(deployed.inputs)
    except (MemoryError, ValueError) as err:  # a size no build names: an edited manifest
        raise TvmfuseError(f"cannot make random inputs of {deployed.path}'s input shapes "
                           f"({type(err).__name__}: {str(err)[:120]}); if its manifest.json was "
                           f"edited, rebuild the model") from None


def _read_inputs(paths: list[Path], deployed) -> list[np.ndarray]:
    for path in paths:
        if not path.is_file():
            raise TvmfuseError(f"input file {path} does not exist")
    try:
        if len(paths) == 1 and paths[0].suffix == ".npz":
            with np.load(paths[0]) as archive:
                missing = [s.name for s in deployed.inputs if s.name not in archive]
                if missing:
                    raise TvmfuseError(
                        f"{paths[0]} has no array named {missing[0]!r} "
                        f"(it holds: {', '.join(archive.files)})"
                    )
                for spec in deployed.inputs:
                    member = archive.zip.getinfo(f"{spec.name}.npy")
                    with archive.zip.open(member) as f:
                        _check_header(f, member.file_size, f"{paths[0]}[{spec.name}]")
                return [archive[s.name] for s in deployed.inputs]
        for path in paths:
            with open(path, "rb") as f:
                _check_header(f, path.stat().st_size, str(path))
        return [np.load(p, allow_pickle=False) for p in paths]
    except (ValueError, OSError, EOFError) as err:
        raise TvmfuseError(f"cannot read inputs {', '.join(map(str, paths))}: {err}") from None


def _check_header(f, size: int, name: str) -> None:
    """Refuse an array whose header claims more data than its file holds, before numpy allocates
    it (a damaged or crafted header can claim terabytes)."""
    fmt = np.lib.format
    version = fmt.read_magic(f)
    read = fmt.read_array_header_1_0 if version == (1, 0) else fmt.read_array_header_2_0
    shape, _, dtype = read(f)
    claimed = math.prod(shape) * dtype.itemsize
    if claimed > size:
        raise TvmfuseError(f"input {name} claims {claimed:,} bytes ({shape}, {dtype}) but holds "
                           f"{size:,}: the file is damaged; write it again with numpy.save")

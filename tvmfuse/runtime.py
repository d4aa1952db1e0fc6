"""Load and run a built library with the TVM runtime alone: no torch, no compiler passes.

This is the deployment path (`tvmfuse run`); keep its imports to numpy, tvm and our manifest.
"""

from __future__ import annotations

import gc
import hashlib
import json
import os
import shutil
import tempfile
import uuid
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .errors import TvmfuseError, one_line
from .specs import TensorSpec, symbolic_sizes
from .targets import get_target

LIBRARY = "model.so"
MANIFEST = "manifest.json"
#: The model's example inputs and its reference's outputs on them, by name, written at build
#: time: ``tvmfuse run --check`` compares a device's outputs against them, with no torch there.
CHECK = "check.npz"


@dataclass
class Deployed:
    """A loaded build: its manifest and a Relax VM ready to run ``main``."""

    path: Path
    manifest: dict
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    vm: object
    device: object
    #: The RPC address it runs at, or None when it runs in this process.
    rpc: str | None = None
    #: The RPC session, while open (see :meth:`close`).
    session: object = None

    def __enter__(self) -> Deployed:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """End the RPC session, if any: the tracker lends its device to one session at a time, so
        an open one makes the next request for that device wait until it times out (600 s on the
        emulator: CI's arm test, holding one while it ran ``tvmfuse run --rpc``, waited on
        itself). The session ends when nothing refers to it; nothing runs here afterwards."""
        if self.session is None:
            return
        self.vm = self.device = self.session = None
        gc.collect()

    @property
    def precision(self) -> str:
        """What the kernels compute in (float16 for a fp16 build; builds before the manifest
        said so were float32)."""
        return self.manifest.get("precision", "float32")

    def run(self, arrays: list[np.ndarray]) -> list[np.ndarray]:
        """Run one inference; checks every input against the manifest first."""
        self._check_open()
        self.check_inputs(arrays)
        args = self._to_device(arrays)
        try:
            if self.rpc is None:
                outputs = to_numpy(self.vm["main"](*args))
            else:
                # over RPC, main's result would be an opaque remote object: run it statefully
                self.vm.set_input("main", *args)
                self.vm.invoke_stateful("main")
                outputs = to_numpy(self.vm.get_outputs("main"))
        except Exception as err:  # noqa: BLE001 - the VM raises TVM's errors of every kind
            self._raise_cuda_error(err, arrays)
            raise TvmfuseError(f"{self.path / self.manifest['library']} did not run on inputs "
                               f"its manifest describes ({one_line(err, 160)}); if "
                               f"{MANIFEST} was edited or the library replaced, rebuild the "
                               f"model") from None
        if len(outputs) != len(self.outputs):
            raise TvmfuseError(f"{self.path / self.manifest['library']} returned "
                               f"{len(outputs)} output(s), its {MANIFEST} names "
                               f"{len(self.outputs)}; rebuild the model")
        return outputs

    def reference(self) -> tuple[list[np.ndarray], list[np.ndarray]] | None:
        """The example inputs and reference outputs saved at build time, or None."""
        path = self.path / CHECK
        if not path.is_file():
            return None
        path = inside(self.path, CHECK)
        try:
            with np.load(path, allow_pickle=False) as saved:
                return ([saved[f"input:{s.name}"] for s in self.inputs],
                        [saved[f"output:{s.name}"] for s in self.outputs])
        except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as err:
            raise TvmfuseError(f"{path} is damaged ({type(err).__name__}: "
                               f"{str(err)[:120]}); rebuild the model") from None

    def check_inputs(self, arrays: list[np.ndarray]) -> None:
        if len(arrays) != len(self.inputs):
            raise TvmfuseError(
                f"the model takes {len(self.inputs)} input(s) "
                f"({', '.join(s.name for s in self.inputs)}), {len(arrays)} given"
            )
        for spec, array in zip(self.inputs, arrays):
            spec.check(array)
        bounds = self.manifest.get("bounds", {})
        for dim, (name, size) in symbolic_sizes(self.inputs, arrays).items():
            if dim in bounds and size > bounds[dim]:
                raise TvmfuseError(f"input {name!r} has {dim} {size}; this build runs {dim} up "
                                   f"to {bounds[dim]} (rebuild it with --max-{dim} {size})")

    def runner(self, arrays: list[np.ndarray]):
        """A zero-argument callable running one blocking inference on ``arrays`` (for timing):
        inputs are checked and copied to the device once, up front."""
        if self.rpc is not None:
            raise TvmfuseError("time a remote build with remote_times(), not a local runner")
        self.check_inputs(arrays)
        args = self._to_device(arrays)
        main = self.vm["main"]

        def run_once():
            try:
                main(*args)
                self.device.sync()
            except Exception as err:  # noqa: BLE001 - as in run()
                self._raise_cuda_error(err, arrays)
                raise

        return run_once

    def _raise_cuda_error(self, err: BaseException, arrays: list[np.ndarray]) -> None:
        """A TvmfuseError of one line when ``err`` is a CUDA error: the error and the kernel
        (found by running ``arrays`` again, see :mod:`tvmfuse.cuda_fault`)."""
        from .cuda_fault import cuda_error, describe  # noqa: PLC0415

        if cuda_error(err) is None:
            return
        library = self.path / self.manifest["library"]
        line = describe(err, library if self.rpc is None else None, arrays)
        raise TvmfuseError(f"{library} failed on the GPU: {line}; this is a fault of tvmfuse's "
                           f"kernel: please report it with the model") from err

    def _check_open(self) -> None:
        if self.vm is None:
            raise TvmfuseError(f"the build in {self.path} was closed (its RPC session ended); "
                               f"load it again")

    def _to_device(self, arrays):
        import tvm  # noqa: PLC0415

        return [tvm.runtime.tensor(np.ascontiguousarray(a), self.device) for a in arrays]


    def remote_times(self, arrays: list[np.ndarray], repeat: int) -> list[float]:
        """Seconds of ``repeat`` runs timed on the remote device itself (RPC builds)."""
        self._check_open()
        self.vm.set_input("main", *self._to_device(arrays))
        timer = self.vm.time_evaluator("invoke_stateful", self.device, number=1, repeat=repeat)
        return list(timer("main").results)


def load(path: str | Path, rpc: str | None = None) -> Deployed:
    """Load the build in ``path`` here, or on the device an RPC tracker knows as ``rpc``
    (``HOST:PORT:KEY``); a TvmfuseError says why when it cannot run there."""
    path = Path(path)
    manifest_path = path / MANIFEST
    if not manifest_path.is_file():
        raise TvmfuseError(f"{path} is not a tvmfuse build: it has no {MANIFEST}")
    manifest_path = inside(path, MANIFEST)
    try:
        manifest = json.loads(manifest_path.read_text())
        target = get_target(manifest["target"]["name"])
        name = manifest["library"]
        inputs = tuple(_spec(s) for s in manifest["inputs"])
        outputs = tuple(_spec(s) for s in manifest["outputs"])
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, ValueError) as err:
        raise TvmfuseError(f"{manifest_path} is damaged ({type(err).__name__}: "
                           f"{one_line(err, 120)}); rebuild the model") from None
    if not isinstance(name, str) or not (path / name).is_file() and not (path / name).is_symlink():
        raise TvmfuseError(f"{path} has no {name}; rebuild the model")
    library = inside(path, name)
    _check_library(library, manifest)
    from tvm import relax  # noqa: PLC0415

    session = None
    if rpc is None:
        reason = target.why_not_runnable()
        if reason:
            raise TvmfuseError(f"this build cannot run here: {reason}; run it on its device "
                               f"with --rpc HOST:PORT:KEY")
        device = target.device_here()
        if target.is_gpu:  # a library holding CUDA C compiles it here: through the cache
            from . import kernel_cache  # noqa: PLC0415

            kernel_cache.install()
        try:
            module = _load_afresh(library)
        except Exception as err:  # noqa: BLE001 - the loader raises TVM's and OS errors alike
            raise TvmfuseError(f"cannot load {library}: {one_line(err)}; rebuild the model") \
                from None
    else:
        from .remote import Remote  # noqa: PLC0415

        session = Remote.parse(rpc).session()
        name = _own_name(library)  # a name of its own there too (see _load_afresh)
        session.upload(str(library), name)
        module = session.load_module(name)
        device = target.device_of(session)
    try:
        vm = relax.VirtualMachine(module, device)
    except Exception as err:  # noqa: BLE001 - a library that is not a Relax VM executable
        raise TvmfuseError(f"cannot load {library}: it is not a tvmfuse build's library "
                           f"({one_line(err, 120)}); rebuild the model") from None
    return Deployed(path, manifest, inputs, outputs, vm, device, rpc, session)


def inside(folder: Path, name: str) -> Path:
    """``folder / name`` when it is a file of ``folder`` itself (no ``..``, no absolute path, no
    symbolic link leading out), else a TvmfuseError: a build folder may come from someone else,
    and its manifest must not make tvmfuse read or load a file elsewhere."""
    path = folder / name
    if Path(name).is_absolute() or ".." in Path(name).parts \
            or path.resolve().parent != folder.resolve():
        raise TvmfuseError(f"{folder}'s {MANIFEST} names {name!r}, which is not a file of the "
                           f"build folder; rebuild the model")
    return path


#: The largest dimension a manifest may name: a tensor's extent is a 32-bit index in the
#: kernels tvmfuse builds.
MAX_DIMENSION = 2**31 - 1


def _spec(obj: dict) -> TensorSpec:
    """A manifest's input or output, checked: a ValueError for a dtype or dimension that no
    build writes (an edited manifest)."""
    spec = TensorSpec.from_json(obj)
    np.dtype(spec.dtype)  # TypeError for a name numpy does not know
    if not isinstance(spec.name, str) or not all(
            isinstance(d, str) or (isinstance(d, int) and 0 <= d <= MAX_DIMENSION)
            for d in spec.shape):
        raise ValueError(f"input or output {spec.name!r} has shape {list(spec.shape)}")
    return spec


def _load_afresh(library: Path):
    """``library`` loaded as it is now, under a name of its own. The dynamic loader hands back
    the library it already has open under the same path, even where the file there was rebuilt
    since: a second build into the same folder, loaded in the same process, ran the first
    build's code and weights. A symbolic link does not help (TVM's loader resolves it to the
    same path); a hard link of a new name does, and costs nothing: made in the build's own
    folder, or where that is read-only, a copy in the temporary directory."""
    import tvm  # noqa: PLC0415

    name = _own_name(library)
    scratch = _holding(library, name)
    try:
        # (the name may go once the library is open: its code and data stay mapped)
        return tvm.runtime.load_module(str(scratch / name))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _own_name(library: Path) -> str:
    return f"{uuid.uuid4().hex}-{library.name}"


def _holding(library: Path, name: str) -> Path:
    """A new folder holding ``library`` as ``name``: a hard link beside it, else a copy in the
    temporary directory."""
    try:
        scratch = Path(tempfile.mkdtemp(prefix=".tvmfuse-load-", dir=library.parent))
    except OSError:
        pass
    else:
        try:
            os.link(library, scratch / name)
            return scratch
        except OSError:
            shutil.rmtree(scratch, ignore_errors=True)
    scratch = Path(tempfile.mkdtemp(prefix="tvmfuse-load-"))
    try:
        shutil.copyfile(library, scratch / name)
    except BaseException:
        shutil.rmtree(scratch, ignore_errors=True)
        raise
    return scratch


def file_digest(path: Path) -> dict:
    """Size and SHA-256 of a build file, as the manifest records them."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return {"bytes": path.stat().st_size, "sha256": digest.hexdigest()}


def _elf_complete(path: Path) -> bool:
    """Whether ``path`` is an ELF file that reaches its section headers (the end of a library as
    linkers write it): the check for builds whose manifest has no digests."""
    with open(path, "rb") as f:
        header = f.read(64)
    if len(header) < 64 or header[:4] != b"\x7fELF" or header[4] != 2:  # 64-bit ELF only
        return False
    order = "little" if header[5] == 1 else "big"
    sections = int.from_bytes(header[0x28:0x30], order)
    size, count = int.from_bytes(header[0x3A:0x3C], order), int.from_bytes(header[0x3C:0x3E], order)
    return sections + size * count <= path.stat().st_size


def _check_library(library: Path, manifest: dict) -> None:
    """A TvmfuseError when ``library`` is not the file the build wrote (truncated, overwritten):
    mapping a truncated library would kill the process with SIGBUS, not raise. A build from
    before the manifest recorded its digest is checked to be a whole ELF file."""
    expected = manifest.get("files", {}).get(library.name)
    if expected is None:
        if not _elf_complete(library):
            raise TvmfuseError(f"{library} is not a whole shared library (truncated or "
                               f"overwritten); rebuild the model")
        return
    found = file_digest(library)
    if found != expected:
        what = "truncated" if found["bytes"] < expected["bytes"] else "overwritten"
        raise TvmfuseError(f"{library} is {what} since it was built ({found['bytes']} "
                           f"bytes, {expected['bytes']} written); rebuild the model")


def to_numpy(result) -> list[np.ndarray]:
    """A VM result (a tensor, or nested tuples of them) as a flat list of numpy arrays."""
    if hasattr(result, "numpy"):
        return [result.numpy()]
    return [leaf for item in result for leaf in to_numpy(item)]

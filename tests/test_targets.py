import re

import pytest
import tvm

from tvmfuse import TvmfuseError
from tvmfuse.targets import avx512_for, get_target, host_target_name, target_names


def test_every_named_target_is_a_valid_tvm_target_with_a_stable_key():
    keys = set()
    for name in target_names():
        spec = get_target(name)
        target = spec.tvm_target()
        assert isinstance(target, tvm.target.Target)
        assert re.fullmatch(r"[a-z0-9][a-z0-9._-]*", spec.key), spec.key
        assert spec.key == get_target(name).key  # stable across calls
        keys.add(spec.key)
    assert len(keys) == len(target_names())


def test_avx512_describes_this_host():
    spec = get_target("avx512")
    assert spec.config["kind"] == "llvm"
    assert spec.config["num-cores"] >= 1
    assert spec.key == f"avx512-{spec.config['mcpu']}"
    assert "avx512f" in spec.cpu_flags


def test_avx2_has_eight_lanes_sixteen_registers_and_no_avx512():
    spec = get_target("avx2")
    assert (spec.vector.lanes, spec.vector.registers) == (8, 16)
    assert spec.key == f"avx2-{spec.config['mcpu']}"
    assert set(spec.cpu_flags) == {"avx2", "fma"}
    # on an AVX-512 host the host's CPU less AVX-512: a library that runs there, records that
    # name the CPU that measured them
    assert ("-avx512f" in spec.config.get("mattr", [])) == ("avx512f" in _flags())


def test_cpu_targets_know_their_l2_cache():
    """A named CPU's L2 comes from the table whatever this host is; the host's own from sysfs."""
    assert avx512_for("znver4").vector.l2_bytes == 1 << 20
    assert avx512_for("emeraldrapids").vector.l2_bytes == 2 << 20
    assert get_target("arm64-a76").vector.l2_bytes == 512 << 10
    assert get_target("arm64").vector.l2_bytes == 1 << 20  # unknown: the default
    host = get_target(host_target_name()).vector.l2_bytes
    assert 128 << 10 <= host <= 64 << 20


def test_the_default_target_runs_on_this_machine():
    """Without --target, tvmfuse builds for the best vector unit this CPU has (a Zen 3 has
    no AVX-512: an avx512 library dies there of an illegal instruction)."""
    name = host_target_name()
    assert get_target().name == name
    assert get_target().why_not_runnable() is None
    flags = _flags()
    expected = "avx512" if "avx512f" in flags else "avx2" if {"avx2", "fma"} <= flags else None
    if expected:
        assert name == expected


def _flags() -> set[str]:
    from tvmfuse.targets import _host_cpu_flags

    return set(_host_cpu_flags())


def test_arm64_is_a_cross_target():
    spec = get_target("arm64")
    assert spec.config["mtriple"] == "aarch64-linux-gnu"
    assert spec.cross_cc == "aarch64-linux-gnu-g++"
    assert spec.why_not_runnable()  # this x86-64 machine cannot run it


def test_cuda_target_spells_out_metaschedule_limits():
    target = get_target("cuda-sm90").tvm_target()
    assert target.kind.name == "cuda"
    assert target.arch == "sm_90"
    assert int(target.attrs["max_threads_per_block"]) == 1024
    assert target.host.kind.name == "llvm"


def test_unknown_target_names_the_choices():
    with pytest.raises(TvmfuseError, match="unknown target 'riscv'.*avx512"):
        get_target("riscv")


def test_importing_tvmfuse_gives_tvm_every_core_unless_told_otherwise():
    """TVM's thread pool takes half the cores by default; a script that imports tvmfuse (not only
    the CLI) gets all of them, and an explicit TVM_NUM_THREADS is kept."""
    import os
    import subprocess
    import sys

    code = "import os, tvmfuse; print(os.environ['TVM_NUM_THREADS'])"
    env = {k: v for k, v in os.environ.items() if k != "TVM_NUM_THREADS"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         check=True).stdout.strip()
    assert out == str(len(os.sched_getaffinity(0)))
    kept = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**env, "TVM_NUM_THREADS": "1"}, check=True).stdout.strip()
    assert kept == "1"


@pytest.mark.parametrize("large", [False, True])
def test_a_library_carries_its_weights_in_an_object_of_their_own(tmp_path, monkeypatch, large):
    """export_library's packed imports (here a VM's bytecode and a 3 x 5 weight) go in as an
    ELF object tvmfuse writes; a blob of the large size goes to x86-64's ``.lrodata``. The
    library loads and computes with the weight it was built with."""
    import numpy as np
    from tvm import relax
    from tvm.script import relax as R

    from tvmfuse import targets

    weight = np.arange(15, dtype="float32").reshape(3, 5)

    @R.function
    def main(x: R.Tensor((2, 3), "float32")) -> R.Tensor((2, 5), "float32"):
        return R.matmul(x, R.const(weight))

    if large:
        monkeypatch.setattr(targets, "_LARGE_BLOB_BYTES", 1)
    spec = get_target("x86-64")
    executable = relax.build(tvm.IRModule({"main": main}), target=spec.tvm_target())
    library = tmp_path / "model.so"
    spec.export(executable, str(library))
    assert _section_of("__tvm_ffi__library_bin", library) == (".lrodata" if large else ".rodata")
    vm = relax.VirtualMachine(tvm.runtime.load_module(str(library)), tvm.cpu())
    x = np.ones((2, 3), "float32")
    np.testing.assert_allclose(vm["main"](tvm.runtime.tensor(x)).numpy(), x @ weight)


def _section_of(symbol: str, library) -> str:
    """The name of the ELF section that holds ``symbol`` in ``library`` (binutils' readelf)."""
    import subprocess

    def readelf(flag):
        return subprocess.run(["readelf", "-W", flag, str(library)], capture_output=True,
                              text=True, check=True).stdout

    index = next(line.split()[6] for line in readelf("--dyn-syms").splitlines()
                 if line.endswith(" " + symbol))
    found = re.search(rf"\[\s*{index}\]\s+(\S+)", readelf("-S"))
    return found.group(1)

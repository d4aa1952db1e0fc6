"""The kernel cache: a CUDA binary compiled once per source, compiler and settings, served from
the cache after that; corrupt entries ignored, ``--no-cache`` honoured. The compiler is TVM's
own callback (nvcc where installed) or, for the cache's logic alone, a counting stand-in."""

import logging
import shutil

import pytest
import tvm_ffi

from tvmfuse import api, env, kernel_cache
from tvmfuse.compiler import cuda_sources

SOURCE = 'extern "C" __global__ void k(float* x) { x[threadIdx.x] += 1.0f; }\n'


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """An empty cache folder of the test's own, the cache on, and the SM 90 target current."""
    monkeypatch.setattr(env, "KERNEL_CACHE", tmp_path / "kernels")
    monkeypatch.setattr(env, "CACHE_ENABLED", True)
    kernel_cache.install()
    with api.get_target("cuda-sm90").tvm_target():
        yield tmp_path / "kernels"
    kernel_cache.install()


@pytest.fixture
def fake_compiler(monkeypatch):
    """TVM's compiler replaced by one that counts its calls and returns the source reversed."""
    calls = []

    def compile_source(code, *_):
        calls.append(code)
        return code[::-1].encode()

    monkeypatch.setitem(kernel_cache._state, "tvm", compile_source)
    monkeypatch.setattr(kernel_cache, "_compiler_version", lambda mode: f"{mode} 13.0")
    return calls


def _compile(code: str) -> bytes:
    """What TVM's code generation or loader calls: the registered callback."""
    return bytes(tvm_ffi.get_global_func(kernel_cache.CALLBACK)(code))


def test_second_compile_of_a_source_comes_from_the_cache(cache, fake_compiler):
    before = kernel_cache.STATS.snapshot()
    first = _compile(SOURCE)
    assert _compile(SOURCE) == first == SOURCE[::-1].encode()
    assert fake_compiler == [SOURCE]
    counted = kernel_cache.STATS.since(before)
    assert (counted.compiled, counted.cached) == (1, 1)
    assert [p.suffix for p in (cache / "cuda").iterdir()] == [".bin"]  # no partial files left


def test_another_source_arch_or_setting_is_another_entry(cache, fake_compiler, monkeypatch):
    keys = {kernel_cache.key_of(SOURCE), kernel_cache.key_of(SOURCE + "\n")}
    monkeypatch.setenv("TVM_CUDA_PTXAS_EXTRA_OPTS", "-O1")
    keys.add(kernel_cache.key_of(SOURCE))
    monkeypatch.delenv("TVM_CUDA_PTXAS_EXTRA_OPTS")
    import tvm

    with tvm.target.Target({"kind": "cuda", "arch": "sm_80"}):
        keys.add(kernel_cache.key_of(SOURCE))
    assert len(keys) == 4 and None not in keys


@pytest.mark.parametrize("damage", ["truncate", "flip", "garbage"])
def test_a_corrupt_entry_is_ignored_with_a_warning_and_rewritten(cache, fake_compiler, caplog,
                                                                 damage):
    good = _compile(SOURCE)
    (entry,) = (cache / "cuda").iterdir()
    data = entry.read_bytes()
    entry.write_bytes({"truncate": data[:-3], "flip": data[:-1] + bytes([data[-1] ^ 1]),
                       "garbage": b"\0" * 10}[damage])
    with caplog.at_level(logging.WARNING, logger="tvmfuse.kernel_cache"):
        assert _compile(SOURCE) == good
    assert "ignoring the corrupt kernel cache entry" in caplog.text
    assert len(fake_compiler) == 2
    assert entry.read_bytes() == data  # compiled again and stored whole
    assert _compile(SOURCE) == good and len(fake_compiler) == 2


def test_no_cache_compiles_every_time_and_writes_nothing(cache, fake_compiler):
    kernel_cache.install(enabled=False)
    _compile(SOURCE)
    _compile(SOURCE)
    assert len(fake_compiler) == 2
    assert not cache.exists()


def test_an_unwritable_cache_costs_a_warning_not_the_build(cache, fake_compiler, caplog):
    cache.write_text("a file where the folder should be")
    with caplog.at_level(logging.WARNING, logger="tvmfuse.kernel_cache"):
        assert _compile(SOURCE) == SOURCE[::-1].encode()
    assert "cannot write the kernel cache" in caplog.text


def test_keys_never_name_a_file_outside_the_cache(cache):
    with pytest.raises(ValueError):
        kernel_cache.entry_path("../" + "0" * 61)
    assert kernel_cache.entry_path("a" * 64).parent == cache / "cuda"


def test_tiny_cuda_build_compiles_once_then_from_the_cache(cache, tmp_path, monkeypatch):
    """A tiny model built for SM 90 here (compile-only), its CUDA C compiled by nvcc through
    the callback TVM calls (at code generation on a GPU machine, at load without one): the
    second compile is served from the cache, byte for byte what nvcc made."""
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc not installed: nothing compiles the CUDA source here")
    monkeypatch.setenv("TVM_CUDA_COMPILE_MODE", "nvcc")
    target = api.get_target("cuda-sm90")
    model = api.import_model("tiny-mobilenet")
    compiled = api.compile_model(model, target, api.BuildOptions())
    # without the CUDA runtime (no GPU here) the library holds CUDA C, compiled when it loads;
    # with it, code generation compiled it already, through the cache
    assert compiled.times.cuda_at_load != target.device_here().exist
    (source,) = cuda_sources(compiled.executable)
    before = kernel_cache.STATS.snapshot()
    binary = _compile(source)
    assert _compile(source) == binary
    counted = kernel_cache.STATS.since(before)
    assert counted.compiled + counted.cached == 2 and counted.cached >= 1
    assert binary == bytes(kernel_cache._state["tvm"](source))  # nvcc again, without the cache
    folder = api.build(compiled, tmp_path / "out")
    again = api.compile_model(model, api.get_target("cuda-sm90"), api.BuildOptions())
    assert cuda_sources(again.executable) == [source]
    assert (api.build(again, tmp_path / "again") / "model.so").read_bytes() == \
        (folder / "model.so").read_bytes()

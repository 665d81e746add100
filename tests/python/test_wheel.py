"""test_wheel.py : `pip install .` makes a true wheel (setup.py, pyproject.toml).

test_cpu_wheel builds one as a user would, `pip wheel` on a copy of the source tree,
CPU only (FLASHC_CMAKE_ARGS=-DFLASHC_CUDA=OFF: CMake and the C compile, about 10 s on
2 cores), without build isolation (setuptools comes with this venv's torch, and
nothing is downloaded). It checks the wheel's name, tags and version label
(flashc-<release>+cpu-cp39-abi3-<platform>: a native library that links no Python,
and _fastcall on the stable ABI; py3-none-<platform> without it, where this Python
has no headers), that it holds libflashc.so and nothing but the package, and that a
fresh venv with the wheel installed imports flashc from it, _fastcall included, and
runs a forward, once whole and once prepared. test_sdist makes an
sdist of a copy of the tree (MANIFEST.in: everything the build reads), checks what it
holds, and builds and runs the same CPU wheel from it (about 20 s more). The other
configurations (CUDA, $FLASHC_LIBRARY) are checked on setup.py's own functions,
without building: a fake nvcc says which CUDA release it is.
"""
import fnmatch
import importlib.util
import io
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import zipfile

import pytest
import torch

import flashc

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# what the top of a source tree holds besides the source: builds, venvs, git
NOT_SOURCE = ("build*", ".venv*", ".git", ".whl", ".gl")


def load_setup():
    """setup.py as a module (it calls setup() only as __main__)."""
    spec = importlib.util.spec_from_file_location("flashc_setup", os.path.join(ROOT, "setup.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def clean_env(**extra):
    """This environment without what points Python at the source tree's flashc."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("FLASHC_LIBRARY", "PYTHONPATH", "FLASHC_FASTCALL")}
    env.update(extra)
    return env


def run(cmd, **kw):
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, **kw)
    assert done.returncode == 0, "%s\n%s%s" % (" ".join(cmd), done.stdout, done.stderr)
    return done.stdout


def copy_source(dest):
    """A copy of the source tree at dest, without builds, venvs, git and caches."""
    shutil.copytree(ROOT, dest, ignore=lambda d, names: [
        n for n in names if n == "__pycache__" or n.endswith(".egg-info") or
        (os.path.samefile(d, ROOT) and any(fnmatch.fnmatch(n, p) for p in NOT_SOURCE))])


def pip_wheel(source, out):
    """pip wheel of source (a tree or an sdist), CPU only, into out."""
    run([sys.executable, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "--no-index",
         "--no-cache-dir", "-w", str(out), str(source)],
        env=clean_env(FLASHC_CMAKE_ARGS="-DFLASHC_CUDA=OFF", FLASHC_BUILD_PROGRESS="0"))


# ---- the wheel of a CPU build ----
def test_cpu_wheel(tmp_path):
    src, out = tmp_path / "src", tmp_path / "wheels"
    copy_source(src)
    pip_wheel(src, out)
    check_cpu_wheel(tmp_path, out)


def check_cpu_wheel(tmp_path, out):
    """The one wheel in out: its name, tags, label and files; then installed in a fresh
    venv, flashc imports from it and runs a forward."""
    version = flashc._lib.VERSION + "+cpu"
    platform = sysconfig.get_platform().replace("-", "_").replace(".", "_")
    fast = os.path.isfile(os.path.join(sysconfig.get_paths()["include"], "Python.h"))
    tag = ("cp39-abi3-" if fast else "py3-none-") + platform
    wheels = os.listdir(out)
    assert wheels == ["flashc-%s-%s.whl" % (version, tag)], wheels
    wheel = out / wheels[0]
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        info = "flashc-%s.dist-info/" % version
        meta = z.read(info + "WHEEL").decode().splitlines()
        metadata = z.read(info + "METADATA").decode().splitlines()
    assert "Tag: " + tag in meta and "Root-Is-Purelib: false" in meta, meta
    assert "Version: " + version in metadata and "Requires-Dist: torch>=1.13" in metadata
    for f in ("flashc/libflashc.so", "flashc/__init__.py", "flashc/_lib.py",
              "flashc/layers/rotary.py") + (("flashc/_fastcall.abi3.so",) if fast else ()):
        assert f in names, names
    assert all(n.startswith(("flashc/", info)) for n in names), names

    # a fresh venv with the wheel alone; torch from this venv through a .pth file
    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", str(venv)])
    python = str(venv / "bin" / "python")
    site = run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).strip()
    with open(os.path.join(site, "torch_from_tests.pth"), "w") as f:
        f.write(os.path.dirname(os.path.dirname(torch.__file__)) + "\n")
    run([python, "-m", "pip", "install", "--no-deps", "--no-index", "--no-cache-dir", str(wheel)])
    probe = """if True:
        import importlib.metadata, json, torch, flashc
        q, k, v = (torch.randn(1, 5, 2, 16, generator=torch.Generator().manual_seed(i))
                   for i in range(3))
        out = flashc.flash_attn_func(q, k, v, causal=True)
        again = flashc.flash_attn_func(q, k, v, causal=True)  # prepared
        ref = torch.nn.functional.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True).transpose(1, 2)
        print(json.dumps({"file": flashc.__file__, "lib": flashc._lib.lib._name,
                          "version": flashc.__version__,
                          "dist": importlib.metadata.version("flashc"),
                          "cuda": flashc._lib.lib.flashc_cuda_compiled(),
                          "fast": getattr(flashc._lib.fastcall, "__file__", None),
                          "same": torch.equal(out, again),
                          "err": (out - ref).abs().max().item()}))"""
    got = json.loads(run([python, "-c", probe], cwd=str(tmp_path), env=clean_env()))
    assert got["file"].startswith(site) and got["lib"] == os.path.join(site, "flashc",
                                                                       "libflashc.so"), got
    assert got["version"] == flashc._lib.VERSION and got["dist"] == version, got
    assert got["cuda"] == 0 and got["err"] < 1e-5 and got["same"], got
    assert got["fast"] == (os.path.join(site, "flashc", "_fastcall.abi3.so") if fast else None), got


# ---- the sdist ----
# what an sdist must hold: the folders the build reads (MANIFEST.in), whole
SDIST_TREES = ("src", "include", "cmake", "python")


def test_sdist(tmp_path):
    """The sdist of a copy of the tree, made by setuptools' PEP 517 hook as
    `python -m build --sdist` calls it (without the isolated environment): named for the
    release alone, it holds CMakeLists.txt, setup.py, pyproject.toml and every file of
    SDIST_TREES but caches and built libraries; `pip wheel` of it builds the CPU wheel
    that test_cpu_wheel checks, and that wheel runs."""
    src, dist, out = tmp_path / "src", tmp_path / "dist", tmp_path / "wheels"
    copy_source(src)
    made = run([sys.executable, "-c", "import sys; from setuptools import build_meta; "
                "print(build_meta.build_sdist(sys.argv[1]))", str(dist)], cwd=str(src),
               env=clean_env()).strip().splitlines()[-1]
    top = "flashc-" + flashc._lib.VERSION
    assert made == top + ".tar.gz" and os.listdir(dist) == [made]
    with tarfile.open(dist / made) as t:
        names = {n[len(top) + 1:] for n in t.getnames() if n.startswith(top + "/")}
    want = {"CMakeLists.txt", "setup.py", "pyproject.toml", "MANIFEST.in", "README.md"}
    for tree in SDIST_TREES:
        for d, dirs, files in os.walk(os.path.join(ROOT, tree)):
            dirs[:] = [n for n in dirs if n != "__pycache__" and not n.endswith(".egg-info")]
            want |= {os.path.relpath(os.path.join(d, f), ROOT) for f in files
                     if not f.endswith((".pyc", ".so")) and ".so." not in f}
    assert want <= names, sorted(want - names)
    assert not [n for n in names if n.endswith((".pyc", ".so")) or "__pycache__" in n]
    pip_wheel(dist / made, out)
    check_cpu_wheel(tmp_path, out)


# ---- setup.py's choices, without building ----
@pytest.fixture
def setup_py():
    return load_setup()


def conf(setup_py, **env):
    return setup_py.configuration(clean_env(**env))


def test_cpu_configuration(setup_py):
    """FLASHC_CUDA false in FLASHC_CMAKE_ARGS, in CMake's spellings, gives +cpu and
    an explicit -DFLASHC_CUDA=OFF; each configuration builds in its own folder."""
    for args in ("-DFLASHC_CUDA=OFF", "-D FLASHC_CUDA:BOOL=0", "-DFLASHC_CUDA=no"):
        c = conf(setup_py, FLASHC_CMAKE_ARGS=args)
        assert c["label"] == "cpu" and "-DFLASHC_CUDA=OFF" in c["cmake"], (args, c)
        assert os.path.basename(c["build"]).startswith("pip-cpu-"), c
    a = conf(setup_py, FLASHC_CMAKE_ARGS="-DFLASHC_CUDA=OFF")["build"]
    assert a == conf(setup_py, FLASHC_CMAKE_ARGS="-DFLASHC_CUDA=OFF")["build"]
    assert a != conf(setup_py, FLASHC_CMAKE_ARGS="-DFLASHC_CUDA=OFF -DFLASHC_CUDA_BWD=OFF")["build"]
    # no nvcc anywhere: CPU, and the reason says where it looked
    setup_py.find_nvcc = lambda defs, env: None
    c = conf(setup_py, FLASHC_CMAKE_ARGS="")
    assert c["label"] == "cpu" and "no nvcc found" in c["why"], c
    with pytest.raises(RuntimeError, match="no nvcc was found"):
        conf(setup_py, FLASHC_CMAKE_ARGS="-DFLASHC_CUDA=ON")


def test_cuda_configuration(setup_py, tmp_path):
    """An nvcc ($CUDACXX, PATH, or named in FLASHC_CMAKE_ARGS) gives +cu<release> and
    the build gets that compiler explicitly."""
    nvcc = tmp_path / "bin" / "nvcc"
    nvcc.parent.mkdir()
    nvcc.write_text("#!/bin/sh\necho 'Cuda compilation tools, release 12.4, V12.4.131'\n")
    nvcc.chmod(0o755)
    named = "-DCMAKE_CUDA_COMPILER=%s -DFLASHC_CUDA_HEADDIMS=128" % nvcc
    for env in ({"CUDACXX": str(nvcc)}, {"CUDACXX": "", "PATH": str(nvcc.parent)},
                {"FLASHC_CMAKE_ARGS": named}):
        c = conf(setup_py, **env)
        assert c["label"] == "cu124", (env, c)
        assert "-DFLASHC_CUDA=ON" in c["cmake"] and "-DCMAKE_CUDA_COMPILER=%s" % nvcc in c["cmake"]
        assert os.path.basename(c["build"]).startswith("pip-cu124-"), c
    c = conf(setup_py, CUDACXX=str(nvcc), FLASHC_CMAKE_ARGS="-DFLASHC_CUDA=OFF")
    assert c["label"] == "cpu", c


def test_library_configuration(setup_py):
    """FLASHC_LIBRARY: the label is what that library holds, and nothing is built;
    a library of another release, or not as labelled, is refused."""
    lib = flashc._lib.lib._name
    cuda = flashc._lib.lib.flashc_cuda_compiled()
    c = conf(setup_py, FLASHC_LIBRARY=lib)
    assert c["label"] == ("cuda" if cuda else "cpu") and c["library"] == lib and "cmake" not in c
    setup_py.check_library(lib, flashc._lib.VERSION, c["label"])
    with pytest.raises(RuntimeError, match="but this package is flashc 9.9.9"):
        setup_py.check_library(lib, "9.9.9", c["label"])
    with pytest.raises(RuntimeError, match="but the wheel is labelled"):
        setup_py.check_library(lib, flashc._lib.VERSION, "cu130" if not cuda else "cpu")
    assert setup_py.release() == flashc._lib.VERSION


def test_progress(setup_py):
    """What the terminal shows of a build: a line per 10% of CMake's progress (Makefile
    or Ninja), the first after pip's spinner line, the next over its character."""
    tty = io.StringIO()
    p = setup_py.Progress(tty)
    for line in ("-- flashc: CUDA 13.0.88 found", "[  5%] Building C object a.o",
                 "[  7%] Building C object b.o", "[ 12%] Building CUDA object c.o",
                 "ptxas info    : Used 255 registers", "[100%] Linking C shared library"):
        p.line(line)
    shown = tty.getvalue()
    assert shown.startswith("\nflashc: build   5% (") and shown.count("\n") == 4, repr(shown)
    assert "\rflashc: build  12% (" in shown and "\rflashc: build 100% (" in shown, repr(shown)
    tty = io.StringIO()
    p = setup_py.Progress(tty)
    p.line("[3/10] Building CUDA object x.o")
    assert "build  30%" in tty.getvalue()
    assert setup_py.terminal({"FLASHC_BUILD_PROGRESS": "0"}) is None

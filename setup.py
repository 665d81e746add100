"""setup.py : the part of `pip install .` that pyproject.toml cannot say: build the C
library, ship it inside the package, and name the wheel after what was built.

What is built. build_py runs CMake on this source tree (Release, the tests and the
command-line program left out) and copies libflashc.so to flashc/libflashc.so. The
CUDA backend is built when an nvcc is found where CMake looks ($CUDACXX, PATH,
$CUDA_PATH/bin) or in /usr/local/cuda/bin (where scripts/deps.sh puts it on PATH for
./run.sh and ./test.sh). This file makes that choice, not CMake's detection: it passes
-DFLASHC_CUDA=ON with -DCMAKE_CUDA_COMPILER, or -DFLASHC_CUDA=OFF, then the options
in $FLASHC_CMAKE_ARGS (e.g. -DFLASHC_CUDA=OFF, -DFLASHC_CUDA_HEADDIMS=128), which it
reads for FLASHC_CUDA and CMAKE_CUDA_COMPILER. Each configuration gets its own build
folder, build/pip-<label>-<hash of the CMake options>: a value CMake cached for an
earlier `pip install .` (FLASHC_CUDA=OFF, a compiler not found) never carries over,
and building a configuration again is incremental. With $FLASHC_LIBRARY set, that
library is shipped instead and nothing is built.

The same build makes flashc._fastcall (python/flashc/_fastcall.c, the package's
prepared calls in C) where CMake finds this Python's headers, and it goes in beside
the library (with $FLASHC_LIBRARY, the _fastcall.abi3.so beside that library, if
any); without it the package runs those calls in Python.

The wheel's name. The version is flashc.h's with a local label saying what the
library holds: 0.4.0+cpu, 0.4.0+cu130 (nvcc's release, as torch names its builds),
or 0.4.0+cuda for a $FLASHC_LIBRARY with CUDA (a library does not say its toolkit).
The library built is checked against it (flashc_version, flashc_cuda_compiled)
before it goes in. The tags are cp39-abi3-<platform> with _fastcall, else
py3-none-<platform>: the wheel holds native code for this platform, but the library
links neither Python nor torch (the package loads it with ctypes) and _fastcall is
built on CPython's stable ABI and links neither either, so one wheel serves every
Python 3 (3.9 on) and every torch.

What a user sees. pip shows a build backend's output only with -v (or when the build
fails); without it, a spinner. So while pip captures the output, the build also
writes a few lines to the terminal (/dev/tty): what it builds and why, CMake's
progress every 10%, the time taken. $FLASHC_BUILD_PROGRESS=0 turns that off; with
no terminal (CI) there is nothing to write to.
"""
import ctypes
import hashlib
import os
import re
import shlex
import shutil
import subprocess
import sys
import time

from setuptools import setup
from setuptools.command.bdist_wheel import bdist_wheel
from setuptools.command.build_py import build_py
from setuptools.command.sdist import sdist
from setuptools.dist import Distribution

ROOT = os.path.dirname(os.path.abspath(__file__))


# ---- what is built ----
def release():
    """flashc.h's FLASHC_VERSION_MAJOR.MINOR.PATCH (CMakeLists.txt checks project()'s
    against it; python/flashc/_lib.py:VERSION is checked by tests/python)."""
    with open(os.path.join(ROOT, "include", "flashc.h")) as f:
        parts = dict(re.findall(r"^#define FLASHC_VERSION_(MAJOR|MINOR|PATCH) (\d+)$", f.read(),
                                re.M))
    return "%s.%s.%s" % (parts["MAJOR"], parts["MINOR"], parts["PATCH"])


def cmake_defs(args):
    """{name: value} of the -D options in a CMake argument list: -DNAME=V,
    -DNAME:TYPE=V, -D NAME=V; a later one wins, as in CMake."""
    defs = {}
    for i, a in enumerate(args):
        if a == "-D" and i + 1 < len(args):
            a = "-D" + args[i + 1]
        m = re.match(r"-D([A-Za-z_][A-Za-z0-9_]*)(?::[A-Za-z]+)?=(.*)$", a)
        if m:
            defs[m.group(1)] = m.group(2)
    return defs


def cmake_true(value):
    """CMake's if(<constant>): ON, YES, TRUE, Y or a non-zero number."""
    v = value.strip().upper()
    return v in ("ON", "YES", "TRUE", "Y") or (re.fullmatch(r"-?\d+(\.\d*)?", v) is not None and
                                               float(v) != 0)


def find_nvcc(defs, env):
    """The nvcc a build would use: CMAKE_CUDA_COMPILER of the options, $CUDACXX (its
    first word, as CMake reads it), nvcc on PATH, $CUDA_PATH/bin/nvcc, then
    /usr/local/cuda/bin/nvcc; None when there is none."""
    if defs.get("CMAKE_CUDA_COMPILER"):
        return defs["CMAKE_CUDA_COMPILER"]
    if env.get("CUDACXX", "").strip():
        return shlex.split(env["CUDACXX"])[0]
    found = shutil.which("nvcc", path=env.get("PATH"))
    if found:
        return found
    for folder in (os.path.join(env["CUDA_PATH"], "bin") if env.get("CUDA_PATH") else None,
                   "/usr/local/cuda/bin"):
        if folder and os.access(os.path.join(folder, "nvcc"), os.X_OK):
            return os.path.join(folder, "nvcc")
    return None


def cuda_label(nvcc):
    """"cu" and the release `nvcc --version` prints ("release 13.0" -> cu130)."""
    try:
        out = subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout
    except OSError as e:
        raise RuntimeError("flashc: cannot run the CUDA compiler %s: %s" % (nvcc, e))
    m = re.search(r"release (\d+)\.(\d+)", out)
    if not m:
        raise RuntimeError("flashc: `%s --version` names no release:\n%s" % (nvcc, out))
    return "cu%s%s" % m.groups()


def library_info(path):
    """(flashc_version(), flashc_cuda_compiled()) of the library at `path`."""
    lib = ctypes.CDLL(os.path.abspath(path))
    lib.flashc_version.restype = ctypes.c_char_p
    return lib.flashc_version().decode(), bool(lib.flashc_cuda_compiled())


def configuration(env):
    """What `pip install .` builds in environment `env`, as a dict: label (cpu, cuXY,
    cuda), why (for the user), and either library ($FLASHC_LIBRARY) or cmake (the
    configure options) and build (the build folder)."""
    lib = env.get("FLASHC_LIBRARY")
    if lib:
        if not os.path.isfile(lib):
            raise RuntimeError("flashc: FLASHC_LIBRARY=%s is not a file" % lib)
        cuda = library_info(lib)[1]
        return {"label": "cuda" if cuda else "cpu", "library": lib,
                "why": "FLASHC_LIBRARY=%s, %s" % (lib, "with CUDA" if cuda else "CPU only")}
    extra = shlex.split(env.get("FLASHC_CMAKE_ARGS", ""))
    defs = cmake_defs(extra)
    nvcc = find_nvcc(defs, env)
    if "FLASHC_CUDA" in defs:
        cuda = cmake_true(defs["FLASHC_CUDA"])
        why = "FLASHC_CUDA=%s in FLASHC_CMAKE_ARGS" % defs["FLASHC_CUDA"]
        if cuda and not nvcc:
            raise RuntimeError("flashc: FLASHC_CMAKE_ARGS asks for CUDA (FLASHC_CUDA=%s) but "
                               "no nvcc was found: set CUDACXX, or put nvcc on PATH" %
                               defs["FLASHC_CUDA"])
    else:
        cuda = nvcc is not None
        why = ("nvcc found: %s" % nvcc if cuda else
               "no nvcc found ($CUDACXX, PATH, $CUDA_PATH/bin, /usr/local/cuda/bin)")
    cmake = ["-DCMAKE_BUILD_TYPE=Release", "-DFLASHC_BUILD_TESTS=OFF", "-DFLASHC_BUILD_TOOLS=OFF",
             "-DPython3_EXECUTABLE=" + sys.executable]
    cmake += (["-DFLASHC_CUDA=ON", "-DCMAKE_CUDA_COMPILER=" + nvcc] if cuda else
              ["-DFLASHC_CUDA=OFF"])
    cmake += extra
    label = cuda_label(nvcc) if cuda else "cpu"
    # the folder's hash leaves out the building Python: each venv (python -m build, uv:
    # one per build) would otherwise start from scratch; _fastcall is on the stable ABI
    key = hashlib.sha1("\0".join(c for c in cmake if not c.startswith("-DPython3_EXECUTABLE="))
                       .encode()).hexdigest()[:8]
    return {"label": label, "why": why, "cmake": cmake,
            "build": os.path.join(ROOT, "build", "pip-%s-%s" % (label, key))}


def check_library(path, release, label):
    """Refuse a library that is not what the wheel's name says."""
    version, cuda = library_info(path)
    if version != release:
        raise RuntimeError("flashc: %s is libflashc %s, but this package is flashc %s" %
                           (path, version, release))
    if cuda != (label != "cpu"):
        raise RuntimeError("flashc: %s was built %s CUDA, but the wheel is labelled +%s" %
                           (path, "with" if cuda else "without", label))


# ---- what the user sees ----
def terminal(env):
    """The terminal to report progress on, or None: only while pip (or anything else)
    captures this process's output, unless $FLASHC_BUILD_PROGRESS=0."""
    if env.get("FLASHC_BUILD_PROGRESS") == "0" or sys.stdout.isatty():
        return None
    try:
        return open("/dev/tty", "w")
    except OSError:  # no controlling terminal: CI, a daemon
        return None


def minutes(seconds):
    return "%d min %02d s" % divmod(int(seconds), 60) if seconds >= 60 else "%.0f s" % seconds


class Progress:
    """A few lines on `tty` (a file, or None: nothing): say() one line, line() each line
    of CMake's build output, which it turns into one line per 10% done. Each line
    starts with \\r so that it overwrites the character of pip's spinner, which pip
    draws where the cursor is; the first starts a line after pip's own."""

    def __init__(self, tty):
        self.tty, self.start, self.tenths, self.first = tty, time.monotonic(), -1, True

    def say(self, text):
        if self.tty:
            self.tty.write(("\n" if self.first else "\r") + text + "\n")
            self.tty.flush()
            self.first = False

    def line(self, line):
        m = re.match(r"\[\s*(\d+)%\]", line)            # Makefiles: "[ 37%] Building ..."
        n = re.match(r"\[(\d+)/(\d+)\]", line)          # Ninja: "[12/80] Building ..."
        pct = int(m.group(1)) if m else 100 * int(n.group(1)) // int(n.group(2)) if n else None
        if pct is not None and pct // 10 > self.tenths:
            self.tenths = pct // 10
            self.say("flashc: build %3d%% (%s)" % (pct, minutes(time.monotonic() - self.start)))


def run_logged(cmd, progress):
    """Run cmd with its output (stderr too) copied line by line to stdout, where pip
    keeps it for -v and for the report of a failed build, and each line to progress."""
    print("flashc: " + shlex.join(cmd), flush=True)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            errors="replace")
    for line in proc.stdout:
        sys.stdout.write(line)
        sys.stdout.flush()
        progress.line(line)
    if proc.wait():
        raise subprocess.CalledProcessError(proc.returncode, cmd)


# ---- the commands ----
class BuildWithLibrary(build_py):
    def run(self):
        super().run()
        conf = configuration(os.environ)
        progress = Progress(terminal(os.environ))
        lib = conf.get("library")
        if lib:
            progress.say("flashc: shipping %s (%s), nothing to build" % (lib, conf["why"]))
        else:
            build = conf["build"]
            cuda = conf["label"] != "cpu"
            progress.say("flashc: building libflashc.so %s+%s with CMake in %s: %s. %s" % (
                release(), conf["label"], os.path.relpath(build, ROOT), conf["why"],
                "A full CUDA build takes 3-5 min on 2 cores (docs/BUILD.md); `pip install -v .` "
                "shows each step" if cuda else "CPU backend only, under a minute"))
            run_logged(["cmake", "-S", ROOT, "-B", build] + conf["cmake"], Progress(None))
            # (the default targets: the library, and _fastcall where CMake made it one; an
            # earlier build's _fastcall goes first, so that only this one's is shipped)
            stale = os.path.join(build, FASTCALL)
            if os.path.exists(stale):
                os.remove(stale)
            run_logged(["cmake", "--build", build, "-j", str(os.cpu_count() or 2)],
                       progress if cuda else Progress(None))
            lib = os.path.join(build, "libflashc.so")
            progress.say("flashc: libflashc.so built in %s" %
                         minutes(time.monotonic() - progress.start))
        check_library(lib, release(), conf["label"])
        shutil.copyfile(lib, os.path.join(self.build_lib, "flashc", "libflashc.so"))
        fast = os.path.join(os.path.dirname(lib), FASTCALL)
        shipped = os.path.join(self.build_lib, "flashc", FASTCALL)
        if os.path.isfile(fast):
            shutil.copyfile(fast, shipped)
        elif os.path.exists(shipped):  # an earlier run's
            os.remove(shipped)


# flashc._fastcall's file as CMake names it (python/flashc/_lib.py looks for it)
FASTCALL = "_fastcall.abi3.so"


class PlatformWheel(bdist_wheel):
    """cp39-abi3-<platform> with _fastcall, else py3-none-<platform> (see the top)."""

    def get_tag(self):
        plat = super().get_tag()[2]
        build_lib = self.get_finalized_command("build_py").build_lib
        fast = os.path.isfile(os.path.join(build_lib, "flashc", FASTCALL))
        return ("cp39", "abi3", plat) if fast else ("py3", "none", plat)


class SourceOnly(sdist):
    """The sdist: the source tree MANIFEST.in names, versioned as flashc.h's release
    alone. The build label says what a built library holds, and an sdist holds none: the
    wheel built from it is labelled by that build's configuration."""

    def run(self):
        self.distribution.metadata.version = release()
        super().run()


class PlatformDistribution(Distribution):
    def has_ext_modules(self):
        return True  # a platform wheel, installed to platlib


if __name__ == "__main__":
    setup(version="%s+%s" % (release(), configuration(os.environ)["label"]),
          package_dir={"": "python"}, packages=["flashc", "flashc.layers"],
          cmdclass={"build_py": BuildWithLibrary, "bdist_wheel": PlatformWheel,
                    "sdist": SourceOnly},
          distclass=PlatformDistribution)

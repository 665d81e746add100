"""setup.py : the part of `pip install .` that pyproject.toml cannot say: build the C
library and ship it inside the package.

build_py runs CMake on this source tree (into build/pip, Release, the tests and the
command-line program left out; the CUDA backend is built when nvcc is found, as in
any build: pass more CMake options in $FLASHC_CMAKE_ARGS, e.g. -DFLASHC_CUDA=OFF) and
copies libflashc.so to flashc/libflashc.so. With $FLASHC_LIBRARY set at install time
it copies that library instead and builds nothing. The wheel is tagged for this
platform (it holds a shared library) but not for a Python ABI or a torch version:
the package loads the library with ctypes.
"""
import os
import shlex
import shutil
import subprocess

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

ROOT = os.path.dirname(os.path.abspath(__file__))


class BuildWithLibrary(build_py):
    def run(self):
        super().run()
        lib = os.environ.get("FLASHC_LIBRARY")
        if not lib:
            build = os.path.join(ROOT, "build", "pip")
            subprocess.check_call(["cmake", "-S", ROOT, "-B", build, "-DCMAKE_BUILD_TYPE=Release",
                                   "-DFLASHC_BUILD_TESTS=OFF", "-DFLASHC_BUILD_TOOLS=OFF"] +
                                  shlex.split(os.environ.get("FLASHC_CMAKE_ARGS", "")))
            subprocess.check_call(["cmake", "--build", build, "--target", "flashc", "-j",
                                   str(os.cpu_count() or 2)])
            lib = os.path.join(build, "libflashc.so")
        shutil.copyfile(lib, os.path.join(self.build_lib, "flashc", "libflashc.so"))


class PlatformDistribution(Distribution):
    def has_ext_modules(self):
        return True


setup(package_dir={"": "python"}, packages=["flashc", "flashc.layers"],
      cmdclass={"build_py": BuildWithLibrary}, distclass=PlatformDistribution)

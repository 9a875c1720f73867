"""pip install . : the native module is built by the project's CMake (as Horovod's setup.py
does), for the interpreter running this script; `cmake --install` then lays the package out in
the wheel: gradcomp/ (the Python sources), gradcomp/_core (the module) and libgradcomp beside
it, gradcomp/launcher (gcrun). Extra CMake arguments: GRADCOMP_CMAKE_ARGS="-DGRADCOMP_WITH_CUDA=OFF"."""
import os
import shlex
import shutil
import subprocess
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = os.path.dirname(os.path.abspath(__file__))


def _forget_a_gone_environment(build_dir):
    """Drops the CMake cache of an earlier build whose tools are gone: pip's isolated builds run
    CMake, ninja and pybind11 from a temporary environment it deletes afterwards, and the next
    build would find them in the cache. The compiled objects stay (ninja rebuilds what changed)."""
    cache = os.path.join(build_dir, "CMakeCache.txt")
    if not os.path.exists(cache):
        return
    with open(cache) as f:
        tools = [line.split("=", 1)[1].strip() for line in f
                 if line.startswith(("CMAKE_COMMAND:", "CMAKE_MAKE_PROGRAM:", "pybind11_DIR:"))]
    if any(tool and not os.path.exists(tool) for tool in tools):
        os.remove(cache)
        shutil.rmtree(os.path.join(build_dir, "CMakeFiles"), ignore_errors=True)


class CMakeBuild(build_ext):
    def run(self):
        build_dir = os.path.join(os.path.abspath(self.build_temp), "cmake")
        _forget_a_gone_environment(build_dir)
        configure = ["cmake", "-S", ROOT, "-B", build_dir, "-DCMAKE_BUILD_TYPE=Release",
                     f"-DGRADCOMP_PYTHON={sys.executable}", "-DGRADCOMP_BUILD_TESTS=OFF",
                     "-DGRADCOMP_BUILD_BENCHMARKS=OFF"]
        try:  # the pybind11 of the build's environment (pip's isolated one, or the system's)
            import pybind11
            configure.append(f"-Dpybind11_DIR={pybind11.get_cmake_dir()}")
        except ImportError:
            pass
        if shutil.which("ninja") and not os.path.exists(os.path.join(build_dir, "CMakeCache.txt")):
            configure += ["-G", "Ninja"]
        configure += shlex.split(os.environ.get("GRADCOMP_CMAKE_ARGS", ""))
        subprocess.check_call(configure)
        subprocess.check_call(["cmake", "--build", build_dir, "--target", "gradcomp_python", "-j",
                               str(os.cpu_count() or 1)])
        subprocess.check_call(["cmake", "--install", build_dir, "--component", "python", "--prefix",
                               os.path.abspath(self.build_lib)])


# Build outputs go to build-pip/, away from the CMake build trees (build/, build-*/).
os.makedirs(os.path.join(ROOT, "build-pip"), exist_ok=True)
# The package is laid out by CMakeBuild (cmake --install), not found in the source tree.
setup(packages=[], py_modules=[], ext_modules=[Extension("gradcomp._core", sources=[])],
      cmdclass={"build_ext": CMakeBuild}, options={"build": {"build_base": "build-pip"}, "egg_info": {"egg_base": "build-pip"}})

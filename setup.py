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


class CMakeBuild(build_ext):
    def run(self):
        build_dir = os.path.join(os.path.abspath(self.build_temp), "cmake")
        configure = ["cmake", "-S", ROOT, "-B", build_dir, "-DCMAKE_BUILD_TYPE=Release",
                     f"-DGRADCOMP_PYTHON={sys.executable}", "-DGRADCOMP_BUILD_TESTS=OFF",
                     "-DGRADCOMP_BUILD_BENCHMARKS=OFF"]
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

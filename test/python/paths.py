"""Where the suites find the interpreter, the launcher and the package they test. In a build the
package is build/python (PYTHONPATH, set by the test registration) and the launcher the clone's
./gcrun; against an installed gradcomp (TEST_GRADCOMP_INSTALLED=1: pip install . or a wheel) both
are the ones installed beside the interpreter."""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# The interpreter running the suite (the registration's GRADCOMP_PYTHON) runs the ranks too.
PY = sys.executable
INSTALLED = os.environ.get("TEST_GRADCOMP_INSTALLED") == "1"
GCRUN = os.path.join(os.path.dirname(PY), "gcrun") if INSTALLED else os.path.join(ROOT, "gcrun")
# mpirun's flags that hand the package's location to the ranks (nothing to hand on when installed).
FORWARD_PACKAGE = ["-x", "PYTHONPATH"] if "PYTHONPATH" in os.environ else []

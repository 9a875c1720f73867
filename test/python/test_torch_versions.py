"""gradcomp.torch on torch releases outside the tested range: a warning naming the version, once,
at the import; never a failure. Inside the range: no warning."""
import subprocess
import warnings

import torch

from gradcomp.torch import compat
from paths import PY


def test_the_range_is_checked_by_release():
    assert compat.untested_torch("1.13.1") is None
    assert compat.untested_torch("2.6.0") is None
    assert compat.untested_torch("2.13.0+cpu") is None
    for version in ("1.12.1", "2.14.1+cu130", "3.0.0a0"):
        message = compat.untested_torch(version)
        assert f"not with torch {version}" in message and "tested with torch 1.13 to 2.13" in message


def test_the_installed_torch_is_in_the_range():
    # Each tested platform's torch (Debian 12's, Debian 13's, pip's) is inside the range it documents.
    assert compat.untested_torch(torch.__version__) is None, torch.__version__


def test_an_untested_torch_warns_once_at_import_and_works():
    code = ("import warnings, torch; torch.__version__ = '2.99.0'\n"
            "with warnings.catch_warnings(record=True) as seen:\n"
            "    warnings.simplefilter('always')\n"
            "    import gradcomp.torch as hvd\n"
            "    import gradcomp.torch\n"
            "print(len([w for w in seen if 'torch 2.99.0' in str(w.message)]), hvd.Compression.maxmin(bits=4).bits)\n")
    r = subprocess.run([PY, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["1", "4"], r.stdout + r.stderr


def test_the_tested_torch_imports_without_warnings():
    r = subprocess.run([PY, "-W", "error", "-c", "import gradcomp.torch"], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]

"""The gcrun command of an installed gradcomp (pip install .): the launcher's modules, copied
here from launcher/ at build time, import each other as siblings, as they do from ./gcrun."""
import os
import sys


def main():
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import gcrun
    return gcrun.main()

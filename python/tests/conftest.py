"""Test setup: use the installed mlakit package, or the source tree's when none is installed
(CPU-side tests need no compiled extension)."""
import os
import sys

try:
    import mlakit  # noqa: F401
except ImportError:
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import mlakit  # noqa: F401

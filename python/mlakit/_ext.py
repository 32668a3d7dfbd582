"""The compiled extension (mlakit._C), loaded if it was built."""
try:
    from . import _C  # noqa: F401
    LOAD_ERROR = None
except ImportError as e:  # built without the extension, or a broken build
    _C = None
    LOAD_ERROR = e

from ._checks import ArgumentError, Error


def require():
    """Returns mlakit._C or raises Error saying why it is missing."""
    if _C is None:
        raise Error("mlakit's CUDA extension is not available (" + str(LOAD_ERROR) + "): build it with "
                    "`pip install --no-build-isolation ./python` on a machine with nvcc", "not_supported")
    return _C


def raise_status(name, message):
    """Raises the Python exception for a library Status with code name `name`."""
    if name == "invalid_argument":
        raise ArgumentError(message)
    raise Error(message, name)

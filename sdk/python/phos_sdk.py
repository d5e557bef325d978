# SPDX-License-Identifier: Apache-2.0
"""The PhOS application SDK for Python: ask for an asynchronous checkpoint of
this process at a point the application chooses, in one line::

    import phos_sdk
    phos_sdk.checkpoint("/ckpt/step-1000")          # mode="cow", "recopy" or "stop"

Under PhOS (``phos run``, which puts this module on PYTHONPATH, or
LD_PRELOAD=libphos.so) the request goes to ``phos checkpoint --leave-running``
and the call returns at once; the process runs on while it is saved. What the
checkpoint did goes to IMAGE.log next to the image. ``available()`` says whether
the process runs under PhOS. Errors raise OSError with the errno of the C SDK
(include/phos/sdk.h): ENOSYS without PhOS, EINVAL, EEXIST.
"""
import ctypes
import os

_MODES = ("cow", "recopy", "stop")


def _entry():
    try:
        # libphos.so is preloaded: its symbols are in the global namespace.
        fn = ctypes.CDLL(None, use_errno=True).phos_sdk_checkpoint
    except AttributeError:
        return None
    fn.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
    fn.restype = ctypes.c_int
    return fn


def available() -> bool:
    """Whether this process runs under PhOS."""
    return _entry() is not None


def checkpoint(image, mode: str = "cow") -> None:
    """Starts a checkpoint of this process into the directory `image` (which must not exist)."""
    if mode not in _MODES:
        raise ValueError(f"mode must be one of {', '.join(_MODES)}, not {mode!r}")
    fn = _entry()
    if fn is None:
        raise OSError(38, "not running under PhOS (phos run, or LD_PRELOAD=libphos.so)")  # ENOSYS
    path = os.fsencode(os.fspath(image))
    if fn(path, mode.encode()) != 0:
        err = ctypes.get_errno() or 22
        raise OSError(err, f"phos checkpoint of {os.fsdecode(path)}: {os.strerror(err)}")

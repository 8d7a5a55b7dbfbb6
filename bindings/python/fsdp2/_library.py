"""The loaded library: its versions and allocator, and the check that it
fits these bindings."""

import os

from . import fsdp2_c as _c


def version():
    """The library's version string."""
    return _c.fsdp2_version_string()


def abi_version():
    """The loaded library's C ABI version as one int, major * 1000 + minor
    (1009 for ABI 1.9; fsdp2_abi_version). Importing fsdp2 already raises
    ImportError when it does not fit the bindings."""
    return _c.fsdp2_abi_version()


def allocator():
    """The memory allocator this process runs with: "tcmalloc", "jemalloc"
    or "system". Ranks started by launch_local run with tcmalloc unless
    FSDP2_ALLOCATOR says otherwise."""
    return _c.fsdp2_allocator()


#: The release version these bindings were built with (c_api/fsdp2.h).
__version__ = _c.FSDP2_VERSION


def _check_abi():
    """The loaded libfsdp2 must have the ABI the extension was compiled
    against: the same major number and at least its minor number."""
    abi = _c.fsdp2_abi_version()
    built = (_c.FSDP2_ABI_VERSION_MAJOR, _c.FSDP2_ABI_VERSION_MINOR)
    if abi // 1000 != built[0] or abi % 1000 < built[1]:
        raise ImportError(
            f"fsdp2 {__version__}: the loaded libfsdp2 has ABI {abi // 1000}.{abi % 1000}, but "
            f"these bindings ({os.path.dirname(os.path.abspath(_c.__file__))}) were built for "
            f"ABI {built[0]}.{built[1]}; install libfsdp2 and the Python package from the same "
            f"fsdp2 release")


_check_abi()

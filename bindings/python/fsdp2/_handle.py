"""_Handle: the owner of one C handle, closed by close() or a with-block."""

from . import fsdp2_c as _c
from ._errors import InvalidHandleError


class _Handle:
    """Owns one C handle; close() (or leaving a with-block) destroys it."""

    _destroy = None

    def __init__(self, handle):
        self._handle = handle

    @property
    def handle(self):
        if self._handle is None:
            raise InvalidHandleError(_c.FSDP2_ERROR_INVALID_HANDLE, "FSDP2_ERROR_INVALID_HANDLE",
                                     f"this {type(self).__name__} is closed")
        return self._handle

    @property
    def closed(self):
        return self._handle is None

    def close(self):
        """Destroys the handle; further calls raise InvalidHandleError."""
        if self._handle is not None:
            type(self)._destroy(self._handle)
            self._handle = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


"""TokenDataLoader: batches read natively from a token file."""

from . import fsdp2_c as _c
from ._handle import _Handle


class TokenDataLoader(_Handle):
    """Batches read natively from a token file (see
    FSDP2Strategy.token_dataloader)."""

    _destroy = staticmethod(_c.fsdp2_dataloader_destroy)

    def __len__(self):
        return _c.fsdp2_dataloader_num_batches(self.handle)

    def set_epoch(self, epoch):
        """Reshuffles the windows for `epoch` (an int >= 0; the order depends
        only on the strategy's seed and the epoch, the same on every rank).
        Call it on every rank before each epoch. A negative epoch raises
        InvalidArgumentError, a closed loader InvalidHandleError."""
        _c.fsdp2_dataloader_set_epoch(self.handle, int(epoch))


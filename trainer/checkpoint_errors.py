"""The error of a checkpoint that is refused unread: shared by the checkpoint files'
loader (trainer.runner.checkpoints) and the shards' (trainer.algorithms.sharding)."""


class UnreadableCheckpoint(ValueError):
    """A checkpoint file, or the folder of shards it names, that is not one or holds
    more than tensors and plain data (unpickling that could run code)."""

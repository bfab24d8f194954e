"""The error of a demo file or dataset that cannot be used, apart from the readers so
that each of them can raise it."""


class DemoFileError(ValueError):
    """A demo file or dataset that cannot be used; the message names the file (or folder)
    and what is wrong with it."""

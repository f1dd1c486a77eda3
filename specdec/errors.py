"""specdec's own exceptions.

Every error a user can cause (a bad path, a bad parameter, a prompt that does not fit) is raised as a
`SpecdecError` subclass with a message that says what to do. The CLI turns these into one red line and
exit code 2; anything else is a bug and keeps its traceback.
"""


class SpecdecError(Exception):
    """Base class: a user-facing error with an actionable message."""


class ConfigError(SpecdecError, ValueError):
    """A parameter, spec string or option has a bad value."""


class ModelLoadError(SpecdecError):
    """A model path, file or hub id cannot be loaded."""


class UnsupportedModelError(ModelLoadError):
    """The model's architecture is not one specdec implements."""


class OfflineError(ModelLoadError):
    """Something must be downloaded but the network (package index or hub) is unreachable."""


class PromptTooLongError(SpecdecError, ValueError):
    """A prompt (plus the tokens asked for) does not fit the model's context."""


class OutOfBlocksError(SpecdecError):
    """The KV block pool cannot hold a request even when it runs alone."""

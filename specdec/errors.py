"""specdec's own exceptions.

Every error a user can cause (a bad path, a bad parameter, a prompt that does not fit, a corrupt weight file)
is raised as a `SpecdecError` subclass with a message that says what to do. The CLI turns these into one red
line and exit code 2; anything else is a bug and keeps its traceback.

This module imports nothing, so `specdec.errors` (and `specdec.config`) load without torch.
"""

from __future__ import annotations


class SpecdecError(Exception):
    """Base class: a user-facing error with an actionable message."""


class ConfigError(SpecdecError, ValueError):
    """A parameter, spec string or option has a bad value.

    `field` names the setting at fault (`"max_num_seqs"`), so a front end can name its own spelling of it
    (the CLI says `--max-concurrency`) instead of the library's.
    """

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class ModelLoadError(SpecdecError):
    """A model path, file or hub id cannot be loaded."""


class CorruptModelError(ModelLoadError):
    """A model file reads, but its weights are damaged (NaN/Inf values, a hash that does not match)."""


class UnsupportedModelError(ModelLoadError):
    """The model's architecture is not one specdec implements."""


class OfflineError(ModelLoadError):
    """Something must be downloaded but the network (package index or hub) is unreachable."""


class PromptTooLongError(SpecdecError, ValueError):
    """A prompt (plus the tokens asked for) does not fit the model's context."""


class OutOfBlocksError(SpecdecError):
    """The KV block pool cannot hold a request even when it runs alone."""


class NumericalError(SpecdecError):
    """The model produced NaN or Inf logits: the request stops instead of emitting garbage tokens."""

    @classmethod
    def non_finite_logits(cls) -> NumericalError:
        """The error for a pass whose logits hold NaN or Inf (health.py's check, or greedy verification's read)."""
        return cls("the model produced NaN/Inf logits, so its output would be garbage; the request was stopped. "
                   "The weights are probably corrupt (re-download or re-convert the model), or the dtype overflows "
                   "(try --dtype float32)")


class MissingDependencyError(SpecdecError):
    """An optional package a command needs is not installed; the message names the extra to install."""

"""Exceptions the optimizer raises, so callers can tell user mistakes from bugs."""


class WillumpError(Exception):
    """Base class of willump's own errors."""


class PipelineError(WillumpError, ValueError):
    """The decorated pipeline or one of its feature groups misbehaved."""


class ArtifactError(WillumpError):
    """A saved artifact is missing, corrupt, tampered with or from other versions."""


class WillumpWarning(UserWarning):
    """Something the user should know about a result: e.g. a max_loss no certification
    split of this size can certify, or a fitted model that was refitted."""

"""Exceptions the optimizer raises, so callers can tell user mistakes from bugs."""


class WillumpError(Exception):
    """Base class of willump's own errors."""


class PipelineError(WillumpError, ValueError):
    """The decorated pipeline or one of its feature groups misbehaved."""


class ArtifactError(WillumpError):
    """A saved artifact is missing, corrupt, tampered with or from other versions."""

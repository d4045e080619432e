"""Every typed CLI error, rendered once by ``app.main()``: ``Error: ...`` plus the next command to run
(and, under ``--json``, one ``vspec/error/1`` object on stdout)."""

from __future__ import annotations


class VspecError(Exception):
    """Base error. ``code`` is stable (scripts may match it); ``exit_code`` is the process status."""

    code = "error"
    exit_code = 1

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint


class UserInputError(VspecError):
    """Bad flags, presets, config files or names: the user can fix the input."""

    code = "bad-input"
    exit_code = 2


class PreconditionError(VspecError):
    """Something must happen first (a model prepared, a file present, a server stopped)."""

    code = "precondition"
    exit_code = 1


class IncompatibleHostError(VspecError):
    """This host's vLLM/platform cannot do what was asked."""

    code = "incompatible-host"
    exit_code = 1


class NotAvailableYet(VspecError):
    """A command whose capability has not landed yet. Says so rather than pretending to work."""

    code = "not-available"
    exit_code = 3


class EngineRunError(VspecError):
    """The engine process failed; the message carries its last error line, the hint the log."""

    code = "engine-failed"
    exit_code = 1


class LifecycleFailed(VspecError):
    """install/upgrade/rollback/uninstall did not end where it should (pip, or the doctor check after it)."""

    code = "lifecycle-failed"
    exit_code = 1

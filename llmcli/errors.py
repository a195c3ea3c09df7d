"""Errors a user can cause. Each carries one line that says what happened and what to do.

The CLI prints `error: <message>` to stderr and exits non-zero, without a traceback (`--debug`
shows it). Library code raises these and never prints.
"""


class LlmcliError(Exception):
    """Base class: the message is one line, written for the person at the terminal."""

    exit_code = 1


class ModelNotFoundError(LlmcliError):
    """A path, name or repository that does not exist."""


class UnsupportedModelError(LlmcliError):
    """An architecture, file type or tokenizer llmcli cannot run."""


class CorruptModelError(LlmcliError):
    """A file that exists but cannot be read: truncated, wrong checksum, malformed."""


class InvalidParameterError(LlmcliError):
    """A flag or setting with a value outside its range."""

    exit_code = 2


class PromptTooLongError(LlmcliError):
    """The prompt does not fit in the context."""


class DeviceUnavailableError(LlmcliError):
    """A device was asked for that this machine or this PyTorch build does not have."""


class DownloadError(LlmcliError):
    """A model could not be fetched (network, authentication, disk)."""


class InvalidModelNameError(LlmcliError):
    """A MODEL that is neither a registry name, a repo id, a pypi: spec nor a path (or tries to escape one)."""

    exit_code = 2


class RegistryError(LlmcliError):
    """A models.toml that cannot be used: the message names the file and the line."""


class NotCachedError(DownloadError):
    """The model is not downloaded and the network may not (--offline) or cannot be used."""


class DiskFullError(DownloadError):
    """The disk filled up during a download; the partial file has been removed."""


class ServeError(LlmcliError):
    """`llmcli serve` cannot listen: the port is taken, the address is not this machine's."""


class LlmcliWarning(UserWarning):
    """Something the user asked for was adjusted (e.g. --threads above the CPU count); the CLI prints
    `warning: <message>` on stderr, one line. Library code issues these with warnings.warn."""


class GrammarError(LlmcliError):
    """A --json-schema, --regex or --grammar that cannot be used: not JSON, not a valid schema, a
    keyword the constraint engine does not implement, a regex or grammar that does not parse."""

    exit_code = 2


class IncompleteOutputError(LlmcliError):
    """Constrained output that ended (at --max-tokens or a full context) before the grammar was satisfied."""


class InvalidOutputError(LlmcliError):
    """Constrained output that does not parse or validate: a bug in the constraint path, never expected."""

"""Named exceptions of the collectors package."""


class BedsideError(Exception):
    """Base of every error bedside reports to a user."""


class RunDirError(BedsideError):
    """A path given as a run directory is not one."""


class RunInfoError(BedsideError):
    """run.json is missing a field, has a wrong value or is not JSON."""


class StoreError(BedsideError):
    """The store cannot be opened, migrated or queried."""


class StoreLockedError(StoreError):
    """Another process holds the store for writing."""


class StoreCorruptError(StoreError):
    """The store file is truncated or fails a block checksum: rebuild it from the telemetry."""


class StoreTamperedError(StoreCorruptError):
    """The store holds code bedside did not write (a view or macro of ours changed, a macro or type of someone
    else's): it is not read; rebuild it from the telemetry."""


class QueryError(StoreError):
    """A user query is not valid SQL, not read-only, or failed."""


class ImportFormatError(BedsideError):
    """A foreign file to import does not have the documented shape."""


class MissingExtraError(BedsideError):
    """An optional library that a command needs is not installed; the message names the extra to install."""

"""The store's exception family.

Expected outcomes of a put or a get are status enums (``storage.status``); exceptions
are for faults: bytes on disk that cannot be what the store wrote, files that cannot be
opened, a configuration that cannot work, and a move that would break an invariant the
files depend on (a bug, checked with code since ``assert`` vanishes under ``python -O``).
Every message names the file and the offset.

    StoreError
    ├── CorruptRecordError(path, offset, detail)   bytes on disk fail a check
    ├── StoreFileError(path, detail)               a file is missing, mis-sized or unusable
    ├── StoreConfigError(detail)                   a setting is out of range
    │   ├── UnknownSettingError                    a settings file names no such table or
    │   │                                          setting (the nearest known name is said)
    │   └── GeometryMismatchError                  a file size other than the one the store
    │                                              was created with
    ├── StoreClosedError                           the store was used after close()
    └── MappedFilePositionError(path, detail)      a MappedFile's positions would break
                                                   their order (storage.mapped_file)
"""

from __future__ import annotations

import errno
import os


class StoreError(Exception):
    """Base of every fault the store raises."""


class CorruptRecordError(StoreError):
    """Bytes on disk fail a structural or checksum check."""

    def __init__(self, path: str, offset: int, detail: str):
        self.path, self.offset, self.detail = path, offset, detail
        super().__init__(f"{path} at offset {offset}: {detail}")


class StoreFileError(StoreError):
    """A store file is missing, has the wrong size, or cannot be mapped."""

    def __init__(self, path: str, detail: str):
        self.path, self.detail = path, detail
        super().__init__(f"{path}: {detail}")


class StoreConfigError(StoreError):
    """A configuration value is out of range or inconsistent."""


class UnknownSettingError(StoreConfigError):
    """A settings file names a table or a setting that does not exist (a misspelling
    would otherwise leave the default in force without a word)."""


class GeometryMismatchError(StoreConfigError):
    """A file size (``GEOMETRY_FIELDS``) set to other than the store recorded when it
    was created: its files would all look damaged."""


class StoreClosedError(StoreError):
    """The store (or one of its files) was used after it was closed."""


def errno_text(code: int) -> str:
    """``EIO: Input/output error`` for an errno."""
    return f"{errno.errorcode.get(code, str(code))}: {os.strerror(code)}"

"""Errors raised when a trace cannot be written or read.

Every message names the file, and where it applies the column and the first bad row, so that a user
can open the file and find the problem.
"""

from __future__ import annotations


class TraceError(Exception):
    """Any problem with a trace directory (missing, exists already, unreadable)."""


class TraceFormatError(TraceError):
    """A trace file whose content breaks the format: names file, column and first bad row."""

    def __init__(self, file, message: str, column: str | None = None, row: int | None = None):
        self.file = str(file)
        self.column = column
        self.row = row
        where = self.file
        if column is not None:
            where += f", column '{column}'"
        if row is not None:
            where += f", row {row}"
        super().__init__(f"{where}: {message}")

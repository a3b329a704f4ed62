"""Exceptions the CLI turns into a one-line `error: ...` and exit code 2."""

from __future__ import annotations


class SweepError(ValueError):
    """A user-facing error: bad input, impossible space, unwritable results dir.

    The message is ONE line that names the offending field or file.
    """


class ConfigError(SweepError):
    """A run file or search-space file is malformed or holds a wrong value."""


class Interrupted(Exception):
    """The sweep was stopped (Ctrl-C); finished batches are kept on disk for a resume."""

    def __init__(self, done: int, total: int, out_dir: str):
        self.done, self.total, self.out_dir = done, total, out_dir
        super().__init__(
            f"interrupted: kept {done} of {total} finished batches in {out_dir}; "
            "run the same command again to resume")

"""Errors shared by the CLI's subcommands."""


class UserError(Exception):
    """A mistake in the user's input: printed as one line, exit status 2, no traceback."""

    exit_status = 2

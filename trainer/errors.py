"""The one exception type a trainer user can cause (bad flag, config, data file, tokenizer, directory),
and how the command-line entry points report it."""

import argparse
import functools
import sys

from trainer import contract


def first_line(error: BaseException) -> str:
    """An exception's message as one line for a user's error or warning: its first line, or its type's name
    where it has no message."""
    text = str(error).strip().splitlines()
    return (text[0] if text else type(error).__name__)[:300]


class UserError(Exception):
    """A problem the user can fix. The entry points print its message as one line and exit
    with `contract.USER_ERROR`, without a traceback. The message names the offending
    flag or file and says how to fix it."""


class OneLineParser(argparse.ArgumentParser):
    """Reports a bad argument as a UserError (one line, exit USER_ERROR) instead of usage text; its
    subcommands' parsers are of its kind."""

    def error(self, message: str):
        raise UserError(f"{message} (see {self.prog} --help)")


def entry_point(prefix: str = ""):
    """Decorates a CLI `main`: a UserError becomes `{prefix}error: <message>` on stderr and
    `contract.USER_ERROR`; a main that returns nothing exits `contract.OK`."""

    def decorate(main):
        @functools.wraps(main)
        def run(*args, **kwargs) -> int:
            try:
                code = main(*args, **kwargs)
            except UserError as error:
                print(f"{prefix}error: {error}", file=sys.stderr)
                return contract.USER_ERROR
            return contract.OK if code is None else code

        return run

    return decorate

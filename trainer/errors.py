"""The one exception type a trainer user can cause (bad flag, config, data file, tokenizer, directory)."""


class UserError(Exception):
    """A problem the user can fix. The entry points print its message as one line and exit
    with `exitcodes.USER_ERROR`, without a traceback. The message names the offending
    flag or file and says how to fix it."""

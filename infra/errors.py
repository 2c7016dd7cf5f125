"""The one exception type a user's stack configuration can cause."""


class ConfigError(Exception):
    """A stack config value or combination the program cannot build. Its message is one line that
    names the key as written in the stack file (`gemma-tpu:tpu.topology`) and the allowed values;
    the Pulumi program and `python -m infra.preview` print it without a traceback."""

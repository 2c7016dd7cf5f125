"""The Pulumi program of the gemma-tpu project: read the stack config, declare the stack.

What it declares is in stack.py; review it offline with `python -m infra.preview --stack NAME`.
"""

import pulumi

from infra.config.stack_files import from_pulumi
from infra.errors import ConfigError
from stack import declare_stack

try:
    config = from_pulumi()
except ConfigError as error:
    # RunError ends `pulumi up` with this one line instead of a traceback.
    raise pulumi.RunError(str(error)) from None

declare_stack(config)

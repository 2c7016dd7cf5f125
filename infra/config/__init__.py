"""The typed stack configuration: its schema and its validation, a module per section of the stack
file (gemma-tpu:tpu is slices.py, beside infra.catalog.tpu's catalog; the other sections are named as their
keys), sections.py the reads they share and stack.py the one entry point.

`parse_stack_config` turns the `config:` section of a stack file into a `StackConfig` and validates
it before any resource is declared; infra.config.stack_files reads that section from a stack file or from
the Pulumi engine. Every problem raises one `ConfigError` whose message names the key as written in
the stack file and the allowed values.

Here is what the whole stack reads; a section's own names (TRAINER_OPTIONS, PRIORITIES...) are
imported from its module.
"""

from infra.config.runs import RunConfig
from infra.config.sections import PROJECT
from infra.config.stack import STACK_NAME_MAX, StackConfig, parse_stack_config
from infra.config.storage import CACHE_HEADROOM_GIB  # workloads.manifests sizes the cache volume with it

__all__ = ["CACHE_HEADROOM_GIB", "PROJECT", "STACK_NAME_MAX", "RunConfig", "StackConfig", "parse_stack_config"]

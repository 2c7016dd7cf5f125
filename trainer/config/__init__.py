"""The trainer's options: one table of flags, a YAML file with the same keys, and the `tiny`, `tiny-chat` and `tiny-vision` presets.

Precedence, lowest first: built-in defaults, `--preset`, the `--config` YAML file, the command line.
Every bad value raises `UserError` naming the flag (or the YAML key and file) and what is allowed.
`options` holds the record and its tables, `flag_values` the kinds of value a flag takes, `parsing` the parser.
"""

from trainer.config.flag_values import (MESH_AXES, SEED_LIMIT, format_mesh, non_negative_float, non_negative_int, parse_mesh,
                                        vocab_chunk_option)
from trainer.config.options import (ATTENTIONS, CHECKPOINT_BYTES_PER_TRAINED_PARAMETER, COMPUTE_DTYPES, DISTRIBUTED_ENV,
                                    GEMMA3_MODELS, LOG_FORMATS, LR_SCHEDULES, OPTIMIZER_STATE_DTYPES, PRECISIONS, PRESET_VALUES,
                                    PRESETS, REMATS, TINY, TrainConfig, model_names)
from trainer.config.parsing import build_parser, parse_config

__all__ = ["ATTENTIONS", "CHECKPOINT_BYTES_PER_TRAINED_PARAMETER", "COMPUTE_DTYPES", "DISTRIBUTED_ENV", "GEMMA3_MODELS",
           "LOG_FORMATS", "LR_SCHEDULES", "MESH_AXES", "OPTIMIZER_STATE_DTYPES", "PRECISIONS", "PRESETS", "PRESET_VALUES",
           "REMATS", "SEED_LIMIT", "TINY", "TrainConfig", "build_parser", "format_mesh", "model_names", "non_negative_float",
           "non_negative_int", "parse_config", "parse_mesh", "vocab_chunk_option"]

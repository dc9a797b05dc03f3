"""Setup <-> DeepSpeed config (``ds_config.json``), in three rooms of the core:

- ``kit.ds_config.writer``: Setup -> ds_config dict (``to_ds_config``, ``write_ds_config``);
- ``kit.ds_config.reader``: ds_config -> Setup, HF Trainer ``"auto"`` values resolved
  (``read_ds_config``, ``from_ds_config``, ``load_ds_config``);
- ``kit.ds_config.parser``: the harness around DeepSpeed's own parser (``validate_ds_config``,
  ``deepspeed_refusals``, ``known_keys``), which imports deepspeed when called.

The keys all three use, with their other spellings, off values and HF's ``"auto"`` rules, are the settings
registry's (``kit.settings``) and ``kit.ds_keys``'s (the batch keys).
"""

from kit.ds_config.parser import Refusal, deepspeed_refusals, known_keys, validate_ds_config
from kit.ds_config.reader import from_ds_config, load_ds_config, read_ds_config
from kit.ds_config.writer import GRADIENT_CLIPPING, LEARNING_RATE, to_ds_config, write_ds_config

__all__ = [
    "GRADIENT_CLIPPING",
    "LEARNING_RATE",
    "Refusal",
    "deepspeed_refusals",
    "from_ds_config",
    "known_keys",
    "load_ds_config",
    "read_ds_config",
    "to_ds_config",
    "validate_ds_config",
    "write_ds_config",
]

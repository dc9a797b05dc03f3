"""DeepSpeed's config keys that are not ZeRO settings: the batch keys, the stage-3 keys the kit reads but
does not model, and the folder examples suggest for NVMe swap files.

Every setting's own key (zero_optimization's, the offload blocks', ``aio``'s) is declared with the setting
in ``kit.settings``; the writer, the reader and the review walk both. What it cannot see: nothing here
knows a Setup; ``tests/test_ds_keys.py`` checks the names against DeepSpeed's own config classes.
"""

from __future__ import annotations

#: top-level batch keys -> Batch field
BATCH_KEYS = {
    "train_micro_batch_size_per_gpu": "micro_batch",
    "gradient_accumulation_steps": "grad_accum",
    "train_batch_size": "train_batch",
}

#: the folder examples, the panels and the plan suggest for NVMe swap files (a drive mounted per node)
EXAMPLE_NVME_PATH = "/local_nvme"

#: zero_optimization keys only stage 3 reads (``DeepSpeedZeroOptimizer_Stage3``, ``zero.Init``) that the
#: kit does not model, by their ``stage3_`` alias and by name (the modelled ones: ``kit.settings``)
STAGE3_UNMODELLED = (
    "stage3_model_persistence_threshold", "model_persistence_threshold",
    "stage3_gather_16bit_weights_on_model_save", "gather_16bit_weights_on_model_save",
    "stage3_gather_fp16_weights_on_model_save", "stage3_module_granularity_threshold",
    "module_granularity_threshold", "stage3_use_all_reduce_for_fetch_params",
    "use_all_reduce_for_fetch_params", "stage3_allgather_sequential", "allgather_sequential",
    "sub_group_size",
)  # fmt: skip

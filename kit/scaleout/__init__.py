"""Beyond one machine: hostfiles, launch commands and network presets, preflight checks, checkpoints.

``bundle`` (everything one launch needs, from one request: what ``zerokit launch-cmd`` prints and writes
and the memory panel's command), ``hostfile`` (DeepSpeed's format, checked line by line), ``commands``
(deepspeed / torchrun / sbatch / docker lines), ``launchers`` (files per launcher), ``network`` (NCCL and
libfabric settings per interconnect), ``doctor`` (preflight), ``commtest`` (collectives checked and timed
on real ranks), ``checkpoints`` (save, resume, consolidate).
"""

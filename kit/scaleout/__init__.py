"""Beyond one machine: hostfiles, launch commands and network presets, preflight checks, checkpoints.

``hostfile`` (DeepSpeed's format, checked line by line), ``commands`` (deepspeed / torchrun / sbatch /
docker lines), ``network`` (NCCL and libfabric settings per interconnect), ``doctor`` (preflight),
``commtest`` (collectives checked and timed on real ranks), ``checkpoints`` (save, resume, consolidate).
"""

"""What runs inside a launched rank (torch and deepspeed imported): never imported by the notebook kernel.

``worker`` runs a launch spec's configurations back to back; ``engine`` builds, feeds, steps and tears
down one DeepSpeed engine; ``measure`` times steps and counts activations, peaks and communication;
``state_walk`` reads model-state bytes from DeepSpeed's own structures; ``baselines`` wraps PyTorch's
DDP and FSDP2; ``nvme_files`` and ``comm_scopes`` measure swap files and traffic per node;
``checkpoint_worker`` and ``commtest_worker`` serve ``kit.scaleout``. What a run trains (the toy models
among them) lives in ``kit.workloads``.
"""

"""In-job runtime: what runs inside the Slurm jobs slurmhet emits.

``launcher`` (rank environment, ``slurmhet run``), ``hostlist`` (Slurm hostlist
expansion), ``progress`` (per-rank progress files for the replanner), ``mps``
(co-location packs under a private MPS daemon), ``checkpoint`` (atomic
checkpoints, stop-on-signal and requeue), ``consolidate`` (weight-averaging
forked copies), ``emulation`` (paced GPU speed on the CPU dev cluster) and
``torch`` (proportional sharding with exact gradients) and ``output``
(whole-line writes to the job's shared output file). Only ``torch``,
``checkpoint`` and ``consolidate`` need torch, and they import it themselves,
so the core CLI works without the ``torch`` extra.
"""

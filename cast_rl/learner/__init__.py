"""The learner: training samples, verl losses, the FSDP engine, weight publishing, driver loops.

Modules (the samples it trains on and their builders are :mod:`cast_rl.samples`, torch-free,
so the replay buffer builds them where it lives): :mod:`.batch` (micro-batches with dynamic padding), :mod:`.losses` (verl's
policy losses, KL penalties and aggregation, plus masked cross-entropy), :mod:`.engine` (one
FSDP2 rank), :mod:`.checkpoint`, :mod:`.nccl_sync` (the GPU weight-broadcast path),
:mod:`.toy` (a learnable first-token task and a transformers sampler), :mod:`.loop` (sync and
async drivers).
"""

"""The stager's plan: which item sits at each plan position, in which batch, for which
training worker. One object, :class:`plan.Plan`, over parts that compose:

    shuffle.py       Shuffle: a fresh permutation of all items per epoch (the default)
    shard_window.py  ShardWindows: tar shards dealt in windows (data.shard_window)
    buckets.py       BucketBatches: another part's order dealt into length buckets
    balance.py       BalancedBatches: epochs balanced by language or speaker, bucketed
    skips.py         known_skips: the clips every run skips, kept out of the balance
    layout.py        EpochLayout: what a part gives the plan for each epoch
    plan.py          Plan: positions, batches, the share, the fingerprint
    make.py          make_plan: the parts a config asks for

A part that orders epochs gives the plan one EpochLayout per epoch: the items in plan
order and, when it cuts batches, where each batch starts and of which bucket. A part
may build on another's order (BucketBatches deals any part's order into buckets), so
another way to order epochs or cut batches is one more part, not another plan class.
Everything is a pure function of the seed and the epoch. This module imports nothing.
A training worker's share of every global batch is shared/run/share.py (the trainer
and the command line import it alone).
"""

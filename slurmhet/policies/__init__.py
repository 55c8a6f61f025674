"""Scheduling policies over time: what the simulator runs at every round or event.

``base`` is the interface (``ClusterView`` in, placements out); ``registry.TIME_POLICIES``
names them. ``default`` is slurmhet's own policy, which plans nothing itself and calls the
live planner (``slurmhet.planner``) so that the simulator measures what ``submit`` ships;
the others re-implement the papers' schedulers and baselines (Gavel, Hare, Hadar/HadarE,
SJF-BCO, Tiresias, YARN-CS, ...) for comparison.
"""

"""slurmhet: heterogeneity-aware batch layer for Slurm."""

__version__ = "0.1.0"

"""Experiments on top of the library: the ablation runner and its plots."""

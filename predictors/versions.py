"""Versions of what turns a model into stored kernels and features, in one small module.

A profile database, a fitted predictor and a cached host calibration each record :data:`PIPELINE_VERSION`; data
recorded under another version came from other kernels or other features and is rebuilt. The constant lives here,
not in the profiling campaign (:mod:`predictors.profiling.zoo_profile`), so code that only needs the version (the host
calibration's cache key, the predictor registry) does not import the profiler and the model-timing stack.
Importing this module imports TVM (through :mod:`tvm_passes`) but nothing of :mod:`predictors` or :mod:`hetpart`'s
compiler.
"""
from __future__ import annotations

from tvm_passes.extract import EXTRACTOR_VERSION
from tvm_passes.schedules import RULES_VERSION

# Bump when the rule pairing deployment kernels with kernel-graph nodes
# (predictors.profiling.kernel_mapping.map_kernels) changes (stored node keys and features are then refreshed by
# `hetpart profile`).
# 3: shared operand sizes break ties between nodes with equal output shapes (GoogLeNet's branches, BERT's
# attention); 2 required equal size multisets, which never held for kernels that also take a constant.
ALIGNMENT_VERSION = 3

# What made a stored graph, its features and its kernel keys (feature extractor, CPU rules, kernel <-> node
# pairing); a stored variant or synthetic spec of another version is extracted again.
PIPELINE_VERSION = f"extract-{EXTRACTOR_VERSION}.rules-{RULES_VERSION}.align-{ALIGNMENT_VERSION}"

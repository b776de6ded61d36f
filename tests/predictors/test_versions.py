"""The pipeline version lives in a small module: the registry and the host calibration read it without importing
the profiling campaign, the profiler or the compiler (tests/test_layering.py checks what the cost path imports)."""


def test_the_pipeline_version_is_built_from_the_extractor_rules_and_alignment_versions():
    from predictors import versions
    from predictors.profiling import kernel_mapping
    from tvm_passes.extract import EXTRACTOR_VERSION
    from tvm_passes.schedules import RULES_VERSION

    assert versions.PIPELINE_VERSION == (f"extract-{EXTRACTOR_VERSION}.rules-{RULES_VERSION}"
                                         f".align-{versions.ALIGNMENT_VERSION}")
    # one alignment version: kernel_mapping's, while it still names one, is the same
    assert getattr(kernel_mapping, "ALIGNMENT_VERSION", versions.ALIGNMENT_VERSION) == versions.ALIGNMENT_VERSION

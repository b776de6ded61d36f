"""The pipeline version lives in a small module: the registry and the host calibration read it without importing
the profiling campaign, the profiler or the compiler."""
import subprocess
import sys


def test_the_pipeline_version_is_built_from_the_extractor_rules_and_alignment_versions():
    from predictors import kernel_mapping, versions
    from tvm_passes.extract import EXTRACTOR_VERSION
    from tvm_passes.schedules import RULES_VERSION

    assert versions.PIPELINE_VERSION == (f"extract-{EXTRACTOR_VERSION}.rules-{RULES_VERSION}"
                                         f".align-{versions.ALIGNMENT_VERSION}")
    # one alignment version: kernel_mapping's, while it still names one, is the same
    assert getattr(kernel_mapping, "ALIGNMENT_VERSION", versions.ALIGNMENT_VERSION) == versions.ALIGNMENT_VERSION


def test_the_registry_imports_neither_the_profiler_nor_the_compiler():
    code = ("import sys\nimport predictors.registry, predictors.versions\n"
            "bad = sorted(m for m in ('predictors.profiler', 'predictors.zoo_profile', 'predictors.model_timing', "
            "'hetpart.driver.api', 'hetpart.driver.compiler') if m in sys.modules)\nprint(','.join(bad))\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "", f"importing the registry pulled in: {result.stdout.strip()}"

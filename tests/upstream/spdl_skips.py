"""The one list of SPDL 0.8.0 tests that the upstream runner deselects, each with its reason.

A test is listed only when it checks a private of SPDL's (named in the reason), a feature
that is not in SPDL 0.8.0 (SPDL's repository is newer than the release), or something out of
gristmill's scope (``spdl.io`` media decoding, CUDA, Python 3.14 sub-interpreters). Patterns
are fnmatch patterns over pytest node ids, relative to the checkout's root (``tests/...``).
"""

# whole files, not even imported
SKIP_FILES: dict[str, str] = {
    "tests/pipeline/arena_packets_test.py": "spdl.io media packets and the repository's "
    "tests/fixture.py (ffmpeg samples): spdl.io is out of scope",
    "tests/pipeline/arena_registry_test.py": "SPDL's arena handler registry (privates "
    "_BytesHandler, _NumpyHandler, _PacketsHandler, _TorchHandler) and spdl.io packets "
    "from tests/fixture.py",
    "tests/pipeline/rng_state_mtmpmtp_test.py": "imports torch at the top (torch is not in "
    "the test environment) and checks sub-interpreter RNG copies (Python 3.14)",
    "tests/dataloader/source_test.py": "spdl.source.imagenet and spdl.source.local_directory "
    "(dataset-specific file listings) are out of scope",
    "tests/pipeline/source_locator_test.py": "SPDL's private helper "
    "spdl.pipeline._common._source_locator.locate_source",
}

SKIPS: dict[str, str] = {}

"""Fixtures of the ``gristmill`` command's tests: a real ``tf.train.Example`` message class
(``inspect``), and a module of pipelines whose slow stage is known (``profile``, as in
tests/engine/test_verdict.py), written where a user's would be."""

import os
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

import gristmill


@pytest.fixture(scope="session")
def example_class():
    """``tf.train.Example`` built by protobuf from its schema (tensorflow/core/example
    /feature.proto, example.proto), so that records are encoded by protobuf itself."""
    pytest.importorskip("google.protobuf")
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    field = descriptor_pb2.FieldDescriptorProto
    file = descriptor_pb2.FileDescriptorProto(
        name="gristmill_test_example.proto", package="gmtest", syntax="proto3"
    )

    def message(name, *fields):
        added = file.message_type.add(name=name)
        for spec in fields:
            added.field.add(**spec)
        return added

    def member(name, number, type_name, label=field.LABEL_OPTIONAL, **more):
        kind = {"bytes": field.TYPE_BYTES, "float": field.TYPE_FLOAT, "int64": field.TYPE_INT64}
        if type_name in kind:
            return dict(name=name, number=number, type=kind[type_name], label=label, **more)
        return dict(
            name=name,
            number=number,
            type=field.TYPE_MESSAGE,
            type_name=f".gmtest.{type_name}",
            label=label,
            **more,
        )

    repeated = field.LABEL_REPEATED
    message("BytesList", member("value", 1, "bytes", repeated))
    message("FloatList", member("value", 1, "float", repeated))
    message("Int64List", member("value", 1, "int64", repeated))
    kinds = [("bytes_list", "BytesList"), ("float_list", "FloatList"), ("int64_list", "Int64List")]
    feature = message(
        "Feature", *(member(n, i, t, oneof_index=0) for i, (n, t) in enumerate(kinds, 1))
    )
    feature.oneof_decl.add(name="kind")
    features = message("Features", member("feature", 1, "Features.FeatureEntry", repeated))
    entry = features.nested_type.add(name="FeatureEntry")
    entry.options.map_entry = True
    entry.field.add(name="key", number=1, type=field.TYPE_STRING, label=field.LABEL_OPTIONAL)
    entry.field.add(**member("value", 2, "Feature"))
    message("Example", member("features", 1, "Features"))
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("gmtest.Example"))


@pytest.fixture
def make_example(example_class):
    """``make_example(label=[7], image=[b"..."], weight=[0.5])``: serialized bytes; the type
    of the first value picks the list (int: int64_list, float: float_list, bytes:
    bytes_list); an empty list sets no kind."""

    def make(**features):
        example = example_class()
        for name, values in features.items():
            feature = example.features.feature[name]
            if not values:
                continue
            kind = {int: "int64_list", float: "float_list", bytes: "bytes_list"}[type(values[0])]
            getattr(feature, kind).value.extend(values)
        return example.SerializeToString(deterministic=True)

    return make


PIPELINES = textwrap.dedent(
    '''
    """Pipelines whose slow stage is known, for `gristmill profile`."""

    import time

    import gristmill as gm
    from gristmill.pipeline import PipelineBuilder

    SLOW_S = 10e-3  # a wait: the machine's load does not move the verdict (test_verdict.py)
    # A MapDataset read with the default ReadOptions is autotuned up to 256 threads (the
    # worker pool's most): 256 waits of 0.4 s (640 elements/s) still limit it when a
    # loaded machine slows the consumer (to 850 elements/s in one CI run, where 256 waits
    # of 0.1 s outran it), over 1,536 elements (6 rounds of them: the first element's
    # inline probe and the threads' start are a small share of the run).
    WIDE_SLOW_S = 0.4


    def waiting(seconds):
        def slow(x):
            time.sleep(seconds)
            return x

        return slow


    slow = waiting(SLOW_S)


    def cheap(x):
        return x + 1


    def slow_keep(x):
        time.sleep(SLOW_S)
        return x % 2 == 0


    def map_dataset():
        return gm.MapDataset.range(1536).map(cheap).map(waiting(WIDE_SLOW_S))


    def endless():
        return gm.MapDataset.range(10**9).map(cheap)


    def iter_dataset():
        read = gm.MapDataset.range(200).to_iter_dataset(gm.ReadOptions(num_threads=0))
        return read.map(cheap).filter(slow_keep).batch(10)


    def iterator():
        return iter(iter_dataset())


    def pipeline():
        return (
            PipelineBuilder()
            .add_source(range(200))
            .pipe(cheap)
            .pipe(slow)
            .aggregate(10)
            .pipe(sum)
            .add_sink(3)
            .build(num_threads=2)
        )


    def a_list():
        return [1, 2, 3]


    not_a_function = 42
    '''
)


@pytest.fixture(scope="session")
def pipelines_source():
    """The text of the module of pipelines (for a test that runs it its own way)."""
    return PIPELINES


@pytest.fixture
def pipelines_module(tmp_path, monkeypatch):
    """The path of a fresh copy of PIPELINES (a unique module name: each test imports its
    own); ``sys.path`` and ``sys.modules`` are restored afterwards."""
    name = f"profiled_{uuid.uuid4().hex[:8]}"
    path = tmp_path / f"{name}.py"
    path.write_text(PIPELINES)
    monkeypatch.setattr(sys, "path", [*sys.path])
    yield path
    sys.modules.pop(name, None)


@pytest.fixture
def run_profile(pipelines_module):
    """``run_profile(function, *flags)``: ``python -m gristmill.cli.main profile
    MODULE:FUNCTION *flags`` run from the pipelines module's folder, with this gristmill
    (a dotted module of the current directory, as a user runs it); its CompletedProcess."""

    def run(function, *flags, timeout=120):
        return subprocess.run(
            [
                sys.executable,
                "-m",
                "gristmill.cli.main",
                "profile",
                f"{pipelines_module.stem}:{function}",
                *flags,
            ],
            cwd=pipelines_module.parent,
            env={**os.environ, "PYTHONPATH": str(Path(gristmill.__file__).parents[1])},
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    return run

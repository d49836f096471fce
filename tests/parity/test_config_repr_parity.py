"""Pipeline config reprs against spdl 0.8.0: the same text, addresses aside."""

import re

import pytest
import spdl.pipeline as spdl_pipeline
import spdl.pipeline.defs  # noqa: F401 (the submodule, as module.defs)

import gristmill.pipeline as gm_pipeline
import gristmill.pipeline.defs  # noqa: F401

pytestmark = pytest.mark.parity
MODULES = {"gristmill": gm_pipeline, "spdl": spdl_pipeline}


def double(x):
    return 2 * x


async def merge_op(info, queues, output):
    return None


class Numbers:
    def __iter__(self):
        return iter(range(3))


def config(module):
    defs = module.defs
    first = (
        module.PipelineBuilder()
        .add_source(list(range(1000)))
        .pipe(double, concurrency=4)
        .pipe(abs, output_order="input")
        .aggregate(3, drop_last=True)
        .disaggregate()
        .add_sink(7)
        .get_config()
    )
    second = defs.PipelineConfig(
        src=defs.SourceConfig(Numbers()), pipes=[], sink=defs.SinkConfig(2)
    )
    merged = defs.MergeConfig([first, second], op=merge_op)
    return defs.PipelineConfig(src=merged, pipes=[defs.Pipe(double)], sink=defs.SinkConfig(3))


def test_config_reprs_match_spdl():
    texts = {which: re.sub(r"0x[0-9a-f]+", "0x", repr(config(m))) for which, m in MODULES.items()}
    assert texts["gristmill"] == texts["spdl"]
    assert "Pipeline 2:" in texts["spdl"]

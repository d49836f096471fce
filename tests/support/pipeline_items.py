"""Reading an SPDL-style pipeline's items in tests: a few, or all of them."""


def take(pipeline, count):
    """Up to ``count`` items of ``pipeline`` (fewer where it ends first)."""
    out = []
    for _ in range(count):
        try:
            out.append(pipeline.get_item(timeout=30))
        except EOFError:
            break
    return out


def drain(pipeline):
    """The rest of ``pipeline``'s items; the pipeline is stopped after."""
    try:
        return take(pipeline, 10**6)
    finally:
        pipeline.stop()


def read_across_epochs(pipeline, count):
    """``count`` items of a continuous ``pipeline``, one list per epoch (the last one open)."""
    seen: list[list] = [[]]
    while sum(map(len, seen)) < count:
        try:
            seen[-1].append(pipeline.get_item(timeout=30))
        except EOFError:
            seen.append([])
    return seen

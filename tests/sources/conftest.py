"""Fixtures shared by the source tests."""

import os

import pytest

AN_HOUR_AGO = 3600


@pytest.fixture
def written_earlier():
    """``written_earlier(path)``: dates ``path`` an hour back (a dataset written a while
    ago, so that a rewrite in the test shows in its modification time) and returns it as
    a str."""

    def age(path):
        earlier = os.stat(path).st_mtime - AN_HOUR_AGO
        os.utime(path, (earlier, earlier))
        return str(path)

    return age

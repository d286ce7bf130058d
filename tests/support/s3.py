"""An S3-compatible server on loopback (moto's, in a thread of the test process) and a bucket per test."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

KEY, SECRET = "test-key", "test-secret"


@dataclass(frozen=True)
class S3:
    """The server's endpoint, an s3fs filesystem on it, and this test's empty bucket."""

    endpoint: str
    fs: Any
    bucket: str


@pytest.fixture(scope="session")
def moto_endpoint() -> Iterator[str]:
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture
def moto_s3(moto_endpoint: str) -> S3:
    import s3fs

    fs = s3fs.S3FileSystem(key=KEY, secret=SECRET, client_kwargs={"endpoint_url": moto_endpoint},
                           skip_instance_cache=True, use_listings_cache=False)
    bucket = f"exports-{uuid.uuid4().hex[:10]}"
    fs.mkdir(bucket)
    return S3(moto_endpoint, fs, bucket)

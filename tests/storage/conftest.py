"""A real S3 endpoint on loopback: moto's standalone server, one per test session, one bucket per test.

The AWS variables point every client at it (s3fs in the driver, and in Spark's Python workers
through the SparkContext's executor environment), as credentials and endpoints come from the
environment on a real cluster. Nothing leaves 127.0.0.1.
"""

import os
import socket
import subprocess
import sys
import time
import uuid

import pytest

from purokit import storage


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory):
    """The endpoint URL of a moto S3 server, with the environment set for it while the session lasts."""
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError("moto's S3 server did not start")
            time.sleep(0.1)
    env = {"AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}", "AWS_ACCESS_KEY_ID": "testing",
           "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
           storage.CACHE_ENV: str(tmp_path_factory.mktemp("purokit-cache"))}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield env
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


@pytest.fixture
def bucket(s3_server):
    """A fresh bucket: its s3:// URL."""
    name = f"purokit-{uuid.uuid4().hex[:10]}"
    fs, _ = storage.filesystem(f"s3://{name}")
    fs.mkdir(name)
    return f"s3://{name}"


@pytest.fixture
def s3_spark(s3_server):
    """The kaiyuan tests' local Spark session, with the S3 environment for its Python workers."""
    from tests.kaiyuan.conftest import _live_session

    spark = _live_session()
    spark.sparkContext.environment.update(s3_server)
    return spark


def upload_tree(local, url: str) -> None:
    """Copy a local directory to an object-store prefix, file by file."""
    fs, inner = storage.filesystem(url)
    for rel, _, _ in storage.list_files(local, hidden=True):
        fs.put_file(str(local / rel), f"{inner}/{rel}")

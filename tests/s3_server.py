"""A real S3-compatible HTTP server for the tests, started by the tests themselves.

moto's S3 service runs in a child process on 127.0.0.1 (a free port), behind a small WSGI
middleware that appends one JSON line per HTTP request (method, key path, Range header, status,
response bytes) to a log file. Tests count what actually crossed the wire by reading that log;
nothing on the client side is wrapped or mocked.

Use from a test module::

    from s3_server import s3_server, s3_url  # noqa: F401  (pytest fixtures)

    def test_x(s3_server, s3_url):
        mjarchive.create(s3_url, ..., storage_options=s3_server.storage_options())

Run standalone (e.g. to try the README commands): ``python tests/s3_server.py --port 5555``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from urllib.parse import unquote

import pytest

# Dummy credentials: moto accepts any; real ones must never be needed or picked up by the tests.
KEY, SECRET, REGION = "testing", "testing", "eu-west-1"


class S3Server:
    """Handle on a moto S3 server child process and its request log."""

    def __init__(self, log_path: Path):
        self.log_path = Path(log_path)
        self._proc: subprocess.Popen | None = None
        self.endpoint_url = ""

    def start(self, timeout: float = 60.0) -> S3Server:
        self.log_path.write_text("")
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        self._proc = subprocess.Popen(
            [sys.executable, __file__, "--port", "0", "--log", str(self.log_path), "--exit-with-stdin"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env,
        )
        line: list[str] = []
        reader = threading.Thread(target=lambda: line.append(self._proc.stdout.readline()), daemon=True)
        reader.start()
        reader.join(timeout)
        if not line or not line[0].startswith("PORT "):
            self.stop()
            raise RuntimeError(f"moto S3 server did not start within {timeout} s (got {line!r})")
        self.endpoint_url = f"http://127.0.0.1:{int(line[0].split()[1])}"
        return self

    def stop(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.stdin.close()
            self._proc.terminate()
            try:
                self._proc.wait(10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()

    def storage_options(self, **extra) -> dict:
        """s3fs options for this server (a fresh dict each call)."""
        return {"endpoint_url": self.endpoint_url, "key": KEY, "secret": SECRET,
                "client_kwargs": {"region_name": REGION}, **extra}

    def create_bucket(self, name: str) -> None:
        import s3fs

        s3fs.S3FileSystem(skip_instance_cache=True, **self.storage_options()).mkdir(name)

    def requests(self, since: int = 0) -> list[dict]:
        """Logged requests from position `since` on (see `mark()`), oldest first."""
        lines = self.log_path.read_text().splitlines()
        return [json.loads(x) for x in lines[since:] if x]

    def mark(self) -> int:
        """The current log position, to pass to `requests(since=...)`."""
        return len(self.log_path.read_text().splitlines())


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory):
    """One moto S3 server for the test session; stopped at the end."""
    pytest.importorskip("moto.server")
    pytest.importorskip("s3fs")
    server = S3Server(tmp_path_factory.mktemp("s3") / "requests.jsonl").start()
    yield server
    server.stop()


@pytest.fixture
def s3_url(s3_server) -> str:
    """`s3://<fresh bucket>/run.mjarchive`, one new bucket per test."""
    bucket = f"mjarchive-test-{uuid.uuid4().hex[:12]}"
    s3_server.create_bucket(bucket)
    return f"s3://{bucket}/run.mjarchive"


# -- the child process ---------------------------------------------------------------------------
def _logging_middleware(app, log_path: str):
    lock, conditional = threading.Lock(), threading.Lock()
    log = open(log_path, "a", buffering=1)  # noqa: SIM115 (lives as long as the server)

    def wrapped(environ, start_response):
        record = {
            "t": time.time(),
            "method": environ["REQUEST_METHOD"],
            "path": unquote(environ.get("PATH_INFO", "")),
            "query": environ.get("QUERY_STRING", ""),
            "range": environ.get("HTTP_RANGE"),
        }

        def logging_start_response(status, headers, exc_info=None):
            record["status"] = int(status.split()[0])
            record["length"] = next((int(v) for k, v in headers if k.lower() == "content-length"), None)
            with lock:
                log.write(json.dumps(record) + "\n")
            return start_response(status, headers, exc_info)

        if environ.get("HTTP_IF_MATCH") or environ.get("HTTP_IF_NONE_MATCH"):
            # moto checks a condition and then stores, in two steps; S3 does both atomically (of two
            # racing conditional PUTs exactly one succeeds). Serialized here so tests see S3's rule.
            with conditional:
                return app(environ, logging_start_response)
        return app(environ, logging_start_response)

    return wrapped


def _exit_when_stdin_closes() -> None:
    """The parent holds our stdin open; when it exits (even by SIGKILL) the pipe closes: stop too."""
    sys.stdin.read()
    os._exit(0)


def _serve(port: int, log_path: str | None) -> None:
    from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
    from werkzeug.serving import make_server

    app = DomainDispatcherApplication(create_backend_app)
    if log_path:
        app = _logging_middleware(app, log_path)
    server = make_server("127.0.0.1", port, app, threaded=True, request_handler=MotoRequestHandler)
    print(f"PORT {server.server_port}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="moto S3 server on 127.0.0.1 with a request log")
    parser.add_argument("--port", type=int, default=5555, help="0 picks a free port (printed as 'PORT n')")
    parser.add_argument("--log", default=None, help="append one JSON line per request to this file")
    parser.add_argument("--exit-with-stdin", action="store_true", help="exit when stdin closes (parent gone)")
    args = parser.parse_args()
    if args.exit_with_stdin:
        threading.Thread(target=_exit_when_stdin_closes, daemon=True).start()
    _serve(args.port, args.log)

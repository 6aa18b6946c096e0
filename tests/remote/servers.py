"""Real servers on loopback for the remote-storage tests and benchmark: nginx and moto's S3.

Each server is a child process of ours, listening on ``127.0.0.1`` at a free
port, started in its own session so that :meth:`Server.stop` can end it and
every process it forked (nginx's worker) by the one process-group id we got
when we started it, and nothing else.

- :func:`start_nginx` serves a directory over HTTP with ``autoindex`` (JSON
  listings under ``/``, nginx's HTML listings under ``/html/``, and under
  ``/bare/`` HTML listings and files without ETag or Last-Modified) and byte
  ranges, from a config file written into a directory of ours
  (``nginx -p <prefix> -c <conf>``, ``daemon off``).
- :func:`start_moto` runs moto's standalone S3 server (``python -m
  moto.server``), the way s3fs's own test suite does; :func:`upload` copies a
  local tree into a bucket with boto3.
- :func:`start_plain_http` serves a directory with python's own
  ``http.server`` (in a thread of this process), which ignores ``Range``
  and answers every GET with the whole file, as some CDNs do.

Example::

    with start_nginx(root='/tmp/site', workdir='/tmp/nginx') as web:
        print(web.url)            # http://127.0.0.1:PORT
"""

from __future__ import annotations

import functools
import http.server
import io
import json
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

__all__ = ['Server', 'ServerUnavailable', 'free_port', 'start_nginx', 'start_moto', 'upload',
           'S3_ENV', 'in_ci', 'PlainHTTP', 'start_plain_http']

START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 10.0

# moto accepts any credentials; these are the values s3fs's and moto's docs use.
S3_ENV = {
    'AWS_ACCESS_KEY_ID': 'testing',
    'AWS_SECRET_ACCESS_KEY': 'testing',
    'AWS_SESSION_TOKEN': 'testing',
    'AWS_DEFAULT_REGION': 'us-east-1',
}


class ServerUnavailable(RuntimeError):
    """The server's program is not installed here (the tests skip, or fail under CI)."""


def in_ci() -> bool:
    """True under CI (``CI=true``): a server that cannot start fails the tests there."""
    return os.environ.get('CI', '').strip().lower() in ('true', '1', 'yes')


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nobody listens on right now."""
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


class Server:
    """A server process of ours on loopback: ``url``, ``port``, ``stop()`` (idempotent)."""

    def __init__(self, name: str, proc: subprocess.Popen, port: int, log: pathlib.Path):
        self.name, self.proc, self.port, self.log = name, proc, port, log
        self.url = f'http://127.0.0.1:{port}'

    def stop(self) -> None:
        """End the process group we started (TERM, then KILL after STOP_TIMEOUT_S)."""
        if self.proc.poll() is None:
            _signal_group(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                pass
        # The leader may be gone while a child it forked lingers (nginx's worker).
        _signal_group(self.proc.pid, signal.SIGKILL)
        try:
            self.proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:  # pragma: no cover - a process that ignores KILL
            pass

    def log_tail(self, n: int = 2000) -> str:
        try:
            return self.log.read_text(errors='replace')[-n:]
        except OSError:
            return ''

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()

    def __repr__(self) -> str:
        return f'Server({self.name!r}, {self.url!r})'


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _wait_listening(proc: subprocess.Popen, port: int, timeout_s: float) -> bool:
    """True once 127.0.0.1:port accepts a connection; False if the process exits first."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        try:
            with socket.create_connection(('127.0.0.1', port), timeout=0.5):
                return True
        except OSError:
            time.sleep(0.05)
    return False


def _start(name: str, argv_for_port, workdir: pathlib.Path, env=None, tries: int = 3) -> Server:
    """Start ``argv_for_port(port)``; retry on another port if one was taken meanwhile."""
    workdir.mkdir(parents=True, exist_ok=True)
    log = workdir / f'{name}.log'
    last = ''
    for _ in range(tries):
        port = free_port()
        with open(log, 'ab') as out:
            proc = subprocess.Popen(argv_for_port(port), stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, env=env, start_new_session=True)
        server = Server(name, proc, port, log)
        if _wait_listening(proc, port, START_TIMEOUT_S):
            return server
        server.stop()
        last = server.log_tail()
    raise RuntimeError(f'{name} did not start on 127.0.0.1 (log {log}):\n{last}')


NGINX_CONF = """\
daemon off;
master_process on;
worker_processes 1;
{user}
pid {prefix}/nginx.pid;
error_log {prefix}/error.log warn;
events {{ worker_connections 512; }}
http {{
    access_log off;
    client_body_temp_path {prefix}/body;
    proxy_temp_path {prefix}/proxy;
    fastcgi_temp_path {prefix}/fastcgi;
    uwsgi_temp_path {prefix}/uwsgi;
    scgi_temp_path {prefix}/scgi;
    default_type application/octet-stream;
    sendfile on;
    keepalive_requests 100000;
    keepalive_timeout 60s;
    server {{
        listen 127.0.0.1:{port};
        root {root};
        location / {{ autoindex on; autoindex_format json; }}
        location /html/ {{ alias {root}/; autoindex on; }}
        # As a server that says no version of its files: no ETag, no Last-Modified
        # (an empty add_header of it drops nginx's own), an HTML listing without times.
        location /bare/ {{
            alias {root}/; autoindex on; etag off; if_modified_since off;
            add_header Last-Modified "";
        }}
    }}
}}
"""


def nginx_binary() -> str:
    """The nginx executable, or ServerUnavailable saying how to install it."""
    found = shutil.which('nginx') or next(
        (p for p in ('/usr/sbin/nginx', '/usr/local/sbin/nginx') if os.access(p, os.X_OK)), None)
    if found is None:
        raise ServerUnavailable('nginx is not installed (apt-get install -y nginx)')
    return found


def start_nginx(root: str | os.PathLike, workdir: str | os.PathLike) -> Server:
    """nginx serving ``root`` read-only at ``http://127.0.0.1:PORT/`` (ranges, JSON autoindex)."""
    binary = nginx_binary()
    root = pathlib.Path(root).resolve()
    prefix = pathlib.Path(workdir).resolve()
    prefix.mkdir(parents=True, exist_ok=True)
    # As root, nginx's worker would drop to 'nobody', who cannot read a 0700 pytest tmp dir.
    user = 'user root root;' if os.geteuid() == 0 else ''

    def argv(port: int) -> list[str]:
        conf = prefix / 'nginx.conf'
        conf.write_text(NGINX_CONF.format(user=user, prefix=prefix, port=port, root=root))
        return [binary, '-p', str(prefix), '-c', str(conf), '-e', str(prefix / 'error.log')]
    return _start('nginx', argv, prefix)


def start_moto(workdir: str | os.PathLike, auth: bool = False) -> Server:
    """moto's S3 server at ``http://127.0.0.1:PORT`` (in-memory; gone when stopped).

    ``auth=True`` turns on moto's IAM checks from the first request, so that
    credentials it never issued (ours) are refused with 403.
    """
    try:
        import moto.server  # noqa: F401 - only to know that it is installed
    except ImportError as exc:
        raise ServerUnavailable(f"moto's server is not installed (pip install 'moto[server]'): "
                                f'{exc}') from exc
    env = {**os.environ, **S3_ENV}
    if auth:
        env['INITIAL_NO_AUTH_ACTION_COUNT'] = '0'
    return _start('moto', lambda port: [sys.executable, '-m', 'moto.server', '-H', '127.0.0.1',
                                        '-p', str(port)], pathlib.Path(workdir), env=env)


def s3_client(endpoint_url: str):
    """A boto3 S3 client for the moto server at ``endpoint_url``."""
    import boto3
    return boto3.client('s3', endpoint_url=endpoint_url, region_name=S3_ENV['AWS_DEFAULT_REGION'],
                        aws_access_key_id=S3_ENV['AWS_ACCESS_KEY_ID'],
                        aws_secret_access_key=S3_ENV['AWS_SECRET_ACCESS_KEY'])


def upload(endpoint_url: str, bucket: str, root: str | os.PathLike, prefix: str = '') -> int:
    """Copy every file under ``root`` to ``s3://bucket/prefix/...``; returns the file count."""
    client = s3_client(endpoint_url)
    try:
        client.create_bucket(Bucket=bucket)
    except client.exceptions.BucketAlreadyOwnedByYou:
        pass
    root = pathlib.Path(root)
    count = 0
    for path in sorted(p for p in root.rglob('*') if p.is_file()):
        key = '/'.join(filter(None, [prefix.strip('/'), path.relative_to(root).as_posix()]))
        client.put_object(Bucket=bucket, Key=key, Body=path.read_bytes())
        count += 1
    return count


class _Logged(http.server.SimpleHTTPRequestHandler):
    """python's file handler (no Range support), each request logged, nothing printed."""

    def send_head(self):
        self.server.log.append((self.command, self.path, self.headers.get('Range', '')))
        return super().send_head()

    def log_message(self, *args) -> None:
        pass


class _JSONListed(_Logged):
    """As :class:`_Logged`, a directory listed as nginx's JSON autoindex does, but with
    each file's size alone (no mtime): a listing that says no version."""

    def list_directory(self, path):
        entries = [{'name': e.name, 'type': 'directory' if e.is_dir() else 'file',
                    **({} if e.is_dir() else {'size': e.stat().st_size})}
                   for e in sorted(os.scandir(path), key=lambda e: e.name)]
        body = json.dumps(entries).encode()
        self.send_response(200)
        self.send_header('Content-Type', 'application/json')
        self.send_header('Content-Length', str(len(body)))
        self.end_headers()
        return io.BytesIO(body)


class _Quiet(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address) -> None:
        pass            # a client that closes after the headers (it did not want the body)


class PlainHTTP:
    """python's ``http.server`` serving a directory on loopback: ``url``, ``log``
    (``(method, path, Range)`` of each request), ``stop()``. ``json_listing``:
    directories listed as JSON with each file's size and no mtime."""

    def __init__(self, root: str | os.PathLike, json_listing: bool = False):
        handler = _JSONListed if json_listing else _Logged
        self._server = _Quiet(('127.0.0.1', 0),
                              functools.partial(handler, directory=os.fspath(root)))
        self._server.log = self.log = []
        self.url = f'http://127.0.0.1:{self._server.server_address[1]}'
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True,
                                        name='plain-http')
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(STOP_TIMEOUT_S)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def start_plain_http(root: str | os.PathLike, json_listing: bool = False) -> PlainHTTP:
    """python's ``http.server`` serving ``root`` at ``http://127.0.0.1:PORT`` (no ranges;
    ``json_listing``: see :class:`PlainHTTP`)."""
    return PlainHTTP(root, json_listing)

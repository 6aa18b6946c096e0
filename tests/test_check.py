"""loadr check: every image and frame decoded, no checksum promised where a format has none,
and digests recorded beside a dataset that catch any changed byte."""

from __future__ import annotations

import dataclasses
import os
import shutil

import pytest

import loadr
from loadr import cli, digests
from loadr.check import write_digests
from loadr.errors import ChecksumError, ConfigError


def copy(fixtures, rel, tmp_path):
    dst = tmp_path / os.path.basename(rel)
    (shutil.copytree if (fixtures / rel).is_dir() else shutil.copy)(fixtures / rel, dst)
    for p in [dst, *dst.rglob('*')] if dst.is_dir() else [dst]:
        os.chmod(p, 0o755 if p.is_dir() else 0o644)
    return dst


def flip(path, offset: int) -> None:
    with open(path, 'r+b') as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0x01]))


def jpeg_scan_offset(jpeg: bytes) -> int:
    """Where the entropy-coded data of a JPEG starts (after the SOS header)."""
    sos = jpeg.index(b'\xff\xda')
    return sos + 2 + int.from_bytes(jpeg[sos + 2:sos + 4], 'big')


def test_a_flipped_byte_in_a_bag_is_found_with_digests(fixtures, tmp_path, capsys):
    data = copy(fixtures, 'bag', tmp_path)
    before = sorted(os.listdir(data))
    assert cli.main(['check', '--write-digests', str(data)]) == 0
    sidecar = digests.sidecar_path(str(data))
    assert os.path.isfile(sidecar) and os.path.dirname(sidecar) == str(tmp_path)
    assert sorted(os.listdir(data)) == before          # nothing inside the dataset
    assert 'wrote digests' in capsys.readouterr().out
    # A byte inside datapoint 7's JPEG scan data: it still decodes, with other pixels.
    r = loadr.open(data, decode_images=False)
    ref = r._shards[0].refs(7)[sorted(r.spec).index('image')]
    bag = r._shards[0].bags['image']
    start = bag.limits[ref - 1] if ref else 0
    jpeg = r[7]['image']
    flip(data / 'image.bag', start + jpeg_scan_offset(jpeg) + 20)
    changed = loadr.open(data)[7]['image']               # decodes: only digests see it
    assert (changed != loadr.open(fixtures / 'bag')[7]['image']).any()
    report = loadr.check(data)
    assert not report.ok
    assert [(p.path, p.index) for p in report.problems] == [(str(data / 'image.bag'), 7)]
    assert 'digest' in report.problems[0].message
    # The readers: opt-in verify names file and index; without it they read as before.
    checked = loadr.open(data, verify=True)
    assert checked[6]['idx'] == loadr.open(fixtures / 'bag')[6]['idx']
    with pytest.raises(ChecksumError) as err:
        checked[7]
    assert (err.value.path, err.value.index) == (str(data / 'image.bag'), 7)
    loadr.open(data)[7]                                  # the original reader ignores it
    assert cli.main(['check', str(data)]) == 1
    assert f'{data / "image.bag"} [index 7]' in capsys.readouterr().out


@pytest.mark.parametrize('rel, damage', [
    ('gulp', 'data_1.gulp'), ('ffrecord/multi', 'PART_00001.ffr'), ('bag_sharded', None)])
def test_digests_catch_a_change_in_any_format_and_any_file(fixtures, tmp_path, rel, damage):
    data = copy(fixtures, rel, tmp_path)
    write_digests(str(data))
    assert loadr.check(data).ok
    files = sorted(p for p in data.rglob('*') if p.is_file())
    target = data / damage if damage else files[len(files) // 2]
    flip(target, os.path.getsize(target) // 2)
    problems = loadr.check(data).problems
    assert problems and all(p.path.startswith(str(data)) for p in problems)
    assert any(p.path == str(target) and 'digest' in p.message for p in problems), problems


def test_verify_needs_the_digests(fixtures, tmp_path):
    data = copy(fixtures, 'gulp', tmp_path)
    with pytest.raises(ConfigError, match='--write-digests'):
        loadr.open(data, verify=True)
    write_digests(str(data))
    r = loadr.open(data, verify=True)
    assert [len(r[i]['frames']) for i in range(len(r))] == [
        len(dp['frames']) for dp in loadr.open(fixtures / 'gulp')]


def test_a_gulp_frame_with_a_destroyed_header_fails_check(fixtures, tmp_path, capsys):
    data = copy(fixtures, 'gulp', tmp_path)
    r = loadr.open(data)
    offset, pad, length = r.frame_info(4)[1]            # video 4, frame 1
    with open(data / 'data_1.gulp', 'r+b') as f:         # keep the SOI marker, zero the rest
        f.seek(offset + 2)                               # of the header
        f.write(b'\0' * 200)
    problems = loadr.check(data).problems
    assert [(p.path, p.index) for p in problems] == [(str(data / 'data_1.gulp'), 4)]
    assert 'frame 1' in problems[0].message


def test_check_promises_checksums_only_where_the_format_has_them(fixtures, tmp_path, capsys):
    assert loadr.check(fixtures / 'ffrecord' / 'single.ffr').checksums == 'CRC32 of every sample'
    assert loadr.check(fixtures / 'bag').checksums is None
    assert cli.main(['check', str(fixtures / 'bag'), str(fixtures / 'ffrecord/single.ffr')]) == 0
    bag_line, ffr_line = capsys.readouterr().out.splitlines()
    assert 'no checksums' in bag_line and '--write-digests' in bag_line
    assert 'CRC32 of every sample' in ffr_line
    data = copy(fixtures, 'bag', tmp_path)
    write_digests(str(data))
    assert loadr.check(data).checksums == 'digests recorded by loadr check --write-digests'


def test_write_digests_refuses_a_dataset_with_problems(fixtures, tmp_path, capsys):
    data = copy(fixtures, 'gulp', tmp_path)
    with open(data / 'data_0.gulp', 'r+b') as f:
        f.truncate(1000)
    assert cli.main(['check', '--write-digests', str(data)]) == 1
    assert not os.path.exists(digests.sidecar_path(str(data)))
    assert 'not written' in capsys.readouterr().out


# -- FFRecord: the CRCs say the bytes are the ones written; check decodes what they hold ------


def test_check_decodes_every_image_of_an_ffrecord_file(tmp_path, capsys):
    from loadr.writers import FFRecordWriter

    from .datasets import jpeg
    good = jpeg((24, 32, 3), seed=1)
    images = [good, jpeg((16, 16, 3), seed=2, fmt='PNG'), good[:len(good) // 2], good,
              b'GIF89a: no JPEG here', good]
    path = tmp_path / 'maps.ffr'
    with FFRecordWriter(path, n=len(images)) as w:          # as loadr convert writes them
        for i, image in enumerate(images):
            w.append({'image': image, 'label': i, 'frames': [good, good[:40] if i == 3 else good]})
    report = loadr.check(path)
    assert not report.ok
    assert [(p.path, p.index) for p in report.problems] == [(str(path), i) for i in (2, 3, 4)]
    cut, frame, other = (p.message for p in report.problems)
    assert "key 'image'" in cut and 'damaged JPEG' in cut
    assert "key 'frames[1]'" in frame and 'damaged JPEG' in frame     # each item of a list too
    assert "key 'image'" in other and 'not a JPEG or PNG' in other
    assert cli.main(['check', str(path)]) == 1
    out = capsys.readouterr().out
    assert f'{path} [index 2]' in out and 'OK' not in out
    # Raw samples that are images (no map around them), in a directory of two files.
    raw = tmp_path / 'raw'
    raw.mkdir()
    for name, samples in (('a.ffr', [good, good]), ('b.ffr', [good, good[:-200], good])):
        with FFRecordWriter(raw / name, n=len(samples)) as w:
            for sample in samples:
                w.write_one(sample)
    (problem,) = loadr.check(raw).problems
    assert problem.path == str(raw / 'b.ffr') and problem.index == 3
    assert 'sample 1 of this file' in problem.message


def test_check_reports_a_sample_that_does_not_read_as_the_others(tmp_path):
    import msgpack

    from loadr.writers import FFRecordWriter
    path = tmp_path / 'x.ffr'
    with FFRecordWriter(path, n=4) as w:
        w.append({'label': 0})
        w.write_one(b'\xc1 not msgpack')
        w.write_one(msgpack.packb([1, 2]))
        w.write_one(b'')
    problems = loadr.check(path).problems
    assert [p.index for p in problems] == [1, 2, 3]
    assert 'does not decode as msgpack' in problems[0].message
    assert 'not a map' in problems[1].message
    # Opaque bytes that are neither maps nor images are data, not a problem.
    with FFRecordWriter(tmp_path / 'blobs.ffr', n=3) as w:
        for blob in (b'\x00\x01', b'', b'plain bytes'):
            w.write_one(blob)
    assert loadr.check(tmp_path / 'blobs.ffr').ok


# -- Parquet: a row is checked for what its read gives, not only for the bytes it holds --------


def test_check_fails_a_parquet_image_stored_by_path_only(tmp_path, capsys):
    pa = pytest.importorskip('pyarrow')
    pq = pytest.importorskip('pyarrow.parquet')

    from .datasets import jpeg
    images = [{'bytes': jpeg((8, 8, 3), seed=k), 'path': f'{k}.jpg'} for k in range(4)]
    images[2] = {'bytes': None, 'path': 'elsewhere/2.jpg'}     # as datasets stores a reference
    path = tmp_path / 'refs.parquet'
    pq.write_table(pa.table({'image': images, 'label': [0, 1, 2, 3]}), path)
    with pytest.raises(loadr.errors.DecodeError):
        loadr.open(path)[2]
    report = loadr.check(path)
    assert [(p.path, p.index) for p in report.problems] == [(str(path), 2)]
    assert 'elsewhere/2.jpg' in report.problems[0].message
    assert cli.main(['check', str(path)]) == 1
    assert f'{path} [index 2]' in capsys.readouterr().out


def test_a_format_whose_check_takes_the_path_alone_is_still_checked():
    # A format of one's own written for local files: check(path), records(path). The
    # built-in ones take the settings of a URL's open as well, and are given them.
    bag = next(f for f in loadr.readers.formats() if f.name == 'bag')
    settings = loadr.storage.settings_for('s3://b/x', {'anon': True})
    seen = []
    mine = dataclasses.replace(bag, name='mine', check=lambda path: seen.append(path) or [],
                               records=lambda path: {path: None})
    assert mine.checks('p', settings) == [] and seen == ['p']
    assert mine.records_of('p', settings) == {'p': None}
    assert dataclasses.replace(bag, records=None).records_of('p', settings) is None
    given = []
    theirs = dataclasses.replace(bag, check=lambda path, storage_options: given.append(
        (path, storage_options)) or [])
    assert theirs.checks('p', settings) == [] and given == [('p', settings)]
    assert theirs.checks('q') == [] and given[-1] == ('q', None)


def test_the_commands_storage_options_leave_a_local_dataset_alone(fixtures, capsys):
    # --storage-option is for URLs: a local path given with it is checked as it is.
    assert cli.main(['--storage-option', 'anon=true', 'check', str(fixtures / 'bag')]) == 0
    assert 'OK: no problems' in capsys.readouterr().out

"""loadr.ingest's building blocks; the commands themselves are tested in test_cli."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from loadr.codecs import decode_image
from loadr.errors import ConfigError, DecodeError
from loadr.ingest import image_jpeg, ingest_images


def _image_bytes(fmt: str) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(np.full((12, 20, 3), 200, np.uint8)).save(buf, fmt)
    return buf.getvalue()


@pytest.mark.parametrize('fmt', ['PNG', 'BMP', 'GIF', 'TIFF', 'PPM'])
def test_image_files_of_the_listed_formats_become_jpeg(fmt):
    out = image_jpeg(_image_bytes(fmt))
    assert out[:2] == b'\xff\xd8' and decode_image(out).shape == (12, 20, 3)


def test_a_jpeg_is_kept_as_it_is_and_shrunk_when_asked():
    jpeg = _image_bytes('JPEG')
    assert image_jpeg(jpeg) == jpeg
    assert decode_image(image_jpeg(jpeg, short_side=6)).shape[:2] == (6, 10)


@pytest.mark.parametrize('fmt', ['PCX', 'TGA', 'ICO'])
def test_formats_outside_the_list_are_refused_whatever_the_file_is_called(fmt):
    with pytest.raises(DecodeError, match='cannot decode image'):
        image_jpeg(_image_bytes(fmt))


def test_a_broken_file_fails_at_ingest_not_in_training():
    with pytest.raises(DecodeError):
        image_jpeg(_image_bytes('JPEG')[:200])


# ----------------------------------------------------------------------------- folders
# loadr ingest images changes nothing silently.


def _save(path, image, fmt, **options) -> bytes:
    path.parent.mkdir(parents=True, exist_ok=True)
    buf = io.BytesIO()
    image.save(buf, fmt, **options)
    path.write_bytes(buf.getvalue())
    return buf.getvalue()


def _noise(h, w, mode='RGB', seed=0):
    rng = np.random.default_rng(seed)
    shape = (h, w) if mode == 'L' else (h, w, len(mode))
    return Image.fromarray(rng.integers(0, 256, shape, dtype=np.uint8), mode)


def _rows(path):
    import loadr
    with loadr.open(path, decode_images=False) as reader:
        return reader.spec, [reader[i] for i in range(len(reader))]


def test_a_folder_of_pngs_is_stored_as_png_byte_for_byte(tmp_path):
    files = {f'{label}/{i}.png': _save(tmp_path / 'src' / label / f'{i}.png',
                                       _noise(9 + i, 7, 'RGBA' if i else 'RGB', seed=i), 'PNG')
             for label in ('a', 'b') for i in range(2)}
    summary = ingest_images(str(tmp_path / 'src'), str(tmp_path / 'out'), workers=0)
    assert summary['image_type'] == 'png' and summary['changed'] == []
    spec, rows = _rows(tmp_path / 'out')
    assert spec['image'] == 'png'
    assert {row['path']: row['image'] for row in rows} == files      # nothing re-encoded


def test_what_is_re_encoded_is_reported_per_file(tmp_path):
    src = tmp_path / 'src'
    jpeg = _save(src / 'a' / 'photo.jpg', _noise(10, 12), 'JPEG')
    _save(src / 'a' / 'drawing.png', _noise(10, 12), 'PNG')
    _save(src / 'b' / 'print.jpg', Image.new('CMYK', (12, 10), (10, 20, 30, 40)), 'JPEG')
    _save(src / 'b' / 'icon.png', _noise(10, 12, 'RGBA'), 'PNG')
    summary = ingest_images(str(src), str(tmp_path / 'out'), workers=0)
    assert summary['image_type'] == 'jpg'                # a JPEG among them: JPEG, kept as is
    changed = dict(summary['changed'])
    assert changed == {
        'a/drawing.png': ['PNG stored as JPEG (quality 90)'],
        'b/icon.png': ['RGBA converted to RGB (alpha dropped: JPEG has none)',
                       'PNG stored as JPEG (quality 90)'],
        'b/print.jpg': ['CMYK converted to RGB', 're-encoded as JPEG (quality 90)']}
    _, rows = _rows(tmp_path / 'out')
    assert {row['path']: row['image'] for row in rows}['a/photo.jpg'] == jpeg
    # Asked to keep PNGs: they are, and the JPEGs become lossless PNGs of their pixels.
    summary = ingest_images(str(src), str(tmp_path / 'png'), workers=0, image_type='png')
    changed = dict(summary['changed'])
    assert changed['a/photo.jpg'] == ['JPEG stored as PNG (lossless)']
    assert 'a/drawing.png' not in changed and 'b/icon.png' not in changed
    _, rows = _rows(tmp_path / 'png')
    photo = {row['path']: row['image'] for row in rows}['a/photo.jpg']
    assert np.array_equal(decode_image(photo), decode_image(jpeg))


def test_the_command_lists_every_change_and_every_file_not_taken(tmp_path):
    import subprocess
    import sys
    src = tmp_path / 'src'
    _save(src / 'a' / '1.jpg', _noise(10, 12), 'JPEG')
    _save(src / 'a' / '2.png', _noise(10, 12), 'PNG')
    (src / 'a' / 'notes.txt').write_text('not an image')
    (src / 'a' / '.DS_Store').write_bytes(b'x')
    (src / 'readme.md').write_text('hello')
    done = subprocess.run([sys.executable, '-m', 'loadr.cli', 'ingest', 'images', str(src),
                           str(tmp_path / 'out')], capture_output=True, text=True, timeout=90)
    assert done.returncode == 0, done.stderr
    assert 'a/2.png: PNG stored as JPEG (quality 90)' in done.stderr
    for name in ('a/notes.txt (not an image file by its extension)', 'a/.DS_Store (hidden)',
                 'readme.md (not in a class folder)'):
        assert name in done.stderr
    assert ('images stored as jpg; 1 changed (re-encoded, converted, shrunk or rotated); '
            '0 with a note; 3 files not taken (listed on stderr)') in done.stdout


def test_exif_orientation_is_kept_and_said_or_applied_when_asked(tmp_path):
    src = tmp_path / 'src'
    image = _noise(10, 16)
    exif = image.getexif()
    exif[0x0112] = 6                               # "rotate 90° clockwise to display"
    data = _save(src / 'a' / 'phone.jpg', image, 'JPEG', exif=exif.tobytes())
    summary = ingest_images(str(src), str(tmp_path / 'kept'), workers=0)
    assert summary['changed'] == []
    assert summary['notes'] == [('a/phone.jpg', ['EXIF orientation 6 not applied (pixels as '
                                                 'stored)'])]
    assert _rows(tmp_path / 'kept')[1][0]['image'] == data
    summary = ingest_images(str(src), str(tmp_path / 'rotated'), workers=0, exif_transpose=True)
    assert summary['changed'] == [('a/phone.jpg', ['rotated by its EXIF orientation 6',
                                                   're-encoded as JPEG (quality 90)'])]
    assert decode_image(_rows(tmp_path / 'rotated')[1][0]['image']).shape == (16, 10, 3)


def test_labels_are_numbered_as_imagefolder_and_an_empty_class_is_refused(tmp_path):
    src = tmp_path / 'src'
    # ImageFolder: sorted(class folder names), a plain string sort: class10 before class2.
    for label in ('class2', 'class10', 'zebra'):
        _save(src / label / '0.jpg', _noise(6, 6), 'JPEG')
    (src / 'empty').mkdir()
    with pytest.raises(ConfigError, match=r"class folder\(s\) without any image: 'empty' "
                                          r"\(torchvision's ImageFolder refuses them too\)"):
        ingest_images(str(src), str(tmp_path / 'out'), workers=0)
    assert not (tmp_path / 'out').exists()
    summary = ingest_images(str(src), str(tmp_path / 'out'), workers=0, allow_empty=True)
    assert summary['empty_labels'] == ['empty'] and summary['labels'] == 4
    _, rows = _rows(tmp_path / 'out')
    want = {name: i for i, name in enumerate(sorted(['class2', 'class10', 'zebra', 'empty']))}
    assert {row['label_name']: row['label'] for row in rows} == {
        k: v for k, v in want.items() if k != 'empty'}
    assert want == {'class10': 0, 'class2': 1, 'empty': 2, 'zebra': 3}
    summary = ingest_images(str(src), str(tmp_path / 'g'), format='gulp', workers=0,
                            allow_empty=True)
    import loadr
    assert loadr.open(tmp_path / 'g').label2idx == want


def test_max_side_stores_larger_images_shrunk_and_says_so(tmp_path):
    import subprocess
    import sys
    src = tmp_path / 'src'
    big = _save(src / 'a' / 'big.jpg', _noise(300, 400), 'JPEG')
    small = _save(src / 'a' / 'small.jpg', _noise(90, 120), 'JPEG')
    _save(src / 'b' / 'tall.png', _noise(250, 60), 'PNG')
    summary = ingest_images(str(src), str(tmp_path / 'out'), workers=0, max_side=200)
    changed = dict(summary['changed'])
    assert changed == {
        'a/big.jpg': ['shrunk from 400x300 to 200x150', 're-encoded as JPEG (quality 90)'],
        'b/tall.png': ['shrunk from 60x250 to 48x200', 'PNG stored as JPEG (quality 90)']}
    _, rows = _rows(tmp_path / 'out')
    stored = {row['path']: row['image'] for row in rows}
    assert stored['a/small.jpg'] == small                 # within max_side: as it was
    assert decode_image(stored['a/big.jpg']).shape == (150, 200, 3)
    assert decode_image(stored['b/tall.png']).shape == (200, 48, 3)
    # Off by default: the same folder is stored as it is (the PNG only re-encoded).
    summary = ingest_images(str(src), str(tmp_path / 'plain'), workers=0)
    assert 'a/big.jpg' not in dict(summary['changed'])
    _, rows = _rows(tmp_path / 'plain')
    assert {row['path']: row['image'] for row in rows}['a/big.jpg'] == big
    # With --short-side too, the stronger shrink wins; the command reports it.
    done = subprocess.run([sys.executable, '-m', 'loadr.cli', 'ingest', 'images', str(src),
                           str(tmp_path / 'cli'), '--max-side', '300', '--short-side', '100',
                           '--workers', '0'], capture_output=True, text=True, timeout=90)
    assert done.returncode == 0, done.stderr
    assert 'a/big.jpg: shrunk from 400x300 to 133x100, re-encoded as JPEG (quality 90)' \
        in done.stderr
    assert 'b/tall.png: PNG stored as JPEG (quality 90)' in done.stderr     # within both
    assert '2 changed' in done.stdout

"""loadr.ingest's building blocks; the commands themselves are tested in test_cli."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from loadr.codecs import decode_image
from loadr.errors import DecodeError
from loadr.ingest import image_jpeg


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

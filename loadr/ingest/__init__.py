"""``loadr ingest``: folders of images or videos into a bag or gulp dataset.

- ``ingest_images(DIR, OUT)``: ``DIR/<label>/<image>``; the label is the
  folder, numbered as torchvision's ``ImageFolder`` numbers it (the class
  folders' names, sorted; an empty class folder is refused unless allowed).
  Bag spec ``{image: jpg|png, label: int, label_name: utf8, path: utf8}``;
  gulp: a one-frame video per image, id = the relative path, meta
  ``{label, label_idx}``, and ``label2idx.json``.
- ``ingest_videos(DIR, OUT)``: ``DIR/<label>/<video>``, a video being a
  video file or a folder of frame images.
- ``ingest_json(LIST.json, VIDEOS, OUT)``: the 20BN (Something-Something,
  Jester) list ``[{"id": ..., "label": ...}, ...]``; video ``VIDEOS/<id>/``
  (frame images) or ``VIDEOS/<id>.<ext>`` (a video file).

Videos become bag ``{id: utf8, frames: jpg[], label: int, meta: msgpack}``
or gulp videos with meta ``{label, label_idx, ...}`` and ``label2idx.json``
(label -1 / no ``label_idx`` for an unlabelled entry). Labels are numbered
in sorted order unless a mapping is given.

Images are stored as they are where the stored type allows (a JPEG in a
``jpg`` key, a PNG in a ``png`` key; checked by decoding them once); other
images are encoded (JPEG quality 90, or lossless PNG) and video frames as
JPEG. ``short_side`` shrinks anything larger (JPEG draft mode makes that
cheap). Whatever is stored differently from the file (re-encoded, converted
from CMYK or a palette, alpha dropped, shrunk, rotated by EXIF), and every
file passed over, is listed in the summary; nothing changes silently. Files are read
and encoded in a process pool; the writer in this process keeps the order of
the sorted file list, so the output does not depend on the worker count. A
file that cannot be read stops the ingest (nothing is written) unless
``skip_bad``.

Video files are decoded with PyAV (``import av``) when it is installed, else
with an ``ffmpeg`` binary on PATH; with neither, a clear error says how to
get one. Folders of frames need neither.

Example::

    summary = ingest_images('photos', 'data/photos', format='bag', workers=4)
    summary = ingest_json('something-something-v2-train.json', 'videos', 'data/ssv2',
                          format='gulp', labels='something-something-v2-labels.json')
"""

from __future__ import annotations

from .images import image_bytes, image_jpeg, ingest_images
from .json_list import ingest_json, read_list
from .scan import (
                   IMAGE_EXTENSIONS,
                   VIDEO_EXTENSIONS,
                   ImageScan,
                   find_images,
                   find_videos,
                   scan_images,
)
from .videos import NO_VIDEO_BACKEND, ingest_videos, video_backend, video_frames

__all__ = ['IMAGE_EXTENSIONS', 'VIDEO_EXTENSIONS', 'NO_VIDEO_BACKEND', 'video_backend',
           'ImageScan', 'scan_images', 'find_images', 'find_videos', 'read_list', 'image_bytes',
           'image_jpeg', 'video_frames', 'ingest_images', 'ingest_videos', 'ingest_json']

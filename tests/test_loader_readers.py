"""The Loader over the real readers and built-in fns: same bytes for any worker count.

The datasets are written by the tests (conftest.local_data), in every format.
"""

import numpy as np
import pytest

import loadr
from loadr import fns

from .loader_helpers import stream_digests


def _label(dp, seed):
    return {'image': dp['image'], 'label': np.int64(dp['idx'])}


def _video_label(dp, seed):
    return {'frames': dp['frames'], 'label': dp['meta']['label_idx']}


# Each opens its dataset under root f, with loadr.open options o (a URL's storage_options).
PIPELINES = {
    'bag': lambda f, **o: (loadr.open(f / 'bag', decode_images=False, **o),
                           [fns.decode_jpeg(key='image', size=(40, 40)),
                            fns.random_crop(key='image', size=32), fns.flip(key='image'), _label]),
    'bag_sharded': lambda f, **o: (loadr.open(f / 'bag_sharded', decode_images=False, **o),
                                   [fns.select(keys=['image', 'idx', 'label']),
                                    fns.decode_jpeg(key='image', size=(24, 24), mode='RGB')]),
    'gulp': lambda f, **o: (loadr.open(f / 'gulp', decode_images=False, **o),
                            [fns.sample_frames(key='frames', num=3, mode='random_clip'),
                             fns.decode_jpeg(key='frames', size=(32, 32), mode='RGB'),
                             fns.normalize(key='frames', layout='CHW'), _video_label]),
    'ffrecord': lambda f, **o: (loadr.open(f / 'ffrecord' / 'multi', decode='msgpack', **o),
                                [fns.decode_jpeg(key='image', size=(20, 20)),
                                 fns.one_hot(key='label', num_classes=1000)]),
}


@pytest.mark.parametrize('name', sorted(PIPELINES))
def test_real_pipelines_are_deterministic_across_workers(local_data, name):
    reader, pipeline = PIPELINES[name](local_data)
    digests = []
    for workers in (0, 2):
        with loadr.Loader(reader, batch=5, fns=pipeline, seed=3, workers=workers) as loader:
            digests.append(stream_digests(loader, 120))
            spec = loader.spec
    assert digests[0] == digests[1]
    assert len(set(digests[0])) > 20            # batches really differ
    list_keys = {k for k, (d, _) in spec.items() if d == np.dtype(object)}
    assert list_keys == ({'label'} if name == 'bag_sharded' else set())


def test_resume_over_a_real_reader(local_data):
    reader, pipeline = PIPELINES['gulp'](local_data)
    with loadr.Loader(reader, batch=4, fns=pipeline, seed=1, workers=2) as loader:
        expected = stream_digests(loader, 30)
    with loadr.Loader(reader, batch=4, fns=pipeline, seed=1, workers=2) as loader:
        loader.load({'step': 4 * 17, 'seed': 1})
        assert stream_digests(loader, 13) == expected[17:]

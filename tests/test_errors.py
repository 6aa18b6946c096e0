import pickle

import pytest

from loadr import errors


def test_tree_is_rooted_in_loadr_error():
    for name in errors.__all__:
        assert issubclass(getattr(errors, name), errors.LoadrError)


def test_errors_name_path_and_index():
    e = errors.ChecksumError('crc32 mismatch', path='x.ffr', index=7)
    assert str(e) == 'x.ffr [index 7]: crc32 mismatch'
    assert (e.path, e.index) == ('x.ffr', 7)


@pytest.mark.parametrize('cls', [getattr(errors, n) for n in errors.__all__])
def test_errors_survive_pickling(cls):
    e = cls('boom', path='a.bag', index=3)
    e.extra = 'kept'
    back = pickle.loads(pickle.dumps(e))
    assert type(back) is cls and str(back) == str(e) and back.extra == 'kept'


def test_read_error_is_an_os_error():
    assert isinstance(errors.ReadError('eio', 'f', 1), OSError)

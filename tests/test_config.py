"""YAML pipelines: building, errors with file/line/hint, overrides, relative paths, configs/."""

from __future__ import annotations

import inspect
import os
import pathlib
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import loadr
import loadr.fns as F
from loadr.config import LOADER_TYPES, load_config, parse_override
from loadr.errors import ConfigError

ROOT = pathlib.Path(__file__).resolve().parent.parent
CONFIGS = ROOT / 'configs'


def write(path: pathlib.Path, text: str) -> pathlib.Path:
    path.write_text(textwrap.dedent(text).lstrip('\n'), encoding='utf-8')
    return path


def bag_yaml(tmp_path, data, loader='{batch: 4, workers: 0, seed: 3}', extra_fns=''):
    """A pipeline over ``data / 'bag'``; reader.path written relative to the YAML file."""
    rel = os.path.relpath(data / 'bag', tmp_path)
    lines = ['# a comment line',
             'reader:',
             f'  path: {rel}',
             '  decode_images: false',
             'fns:',
             '  - decode_jpeg: {key: image, size: [32, 32]}',
             f'  - flip{extra_fns}',
             '  - select: [image, idx]',
             f'loader: {loader}']
    path = tmp_path / 'p.yaml'
    path.write_text('\n'.join(lines) + '\n', encoding='utf-8')
    return path


def first_batch(loader):
    with loader:
        return next(iter(loader))


def test_pipeline_gives_what_the_same_loader_built_in_python_gives(tmp_path, local_data):
    path = bag_yaml(tmp_path, local_data)
    got = first_batch(loadr.pipeline(path))
    reader = loadr.open(local_data / 'bag', decode_images=False)
    fns = [F.decode_jpeg(key='image', size=[32, 32]), F.flip(), F.select(['image', 'idx'])]
    want = first_batch(loadr.Loader(reader, batch=4, fns=fns, workers=0, seed=3))
    assert set(got) == {'image', 'idx'} and got['image'].shape == (4, 32, 32, 3)
    assert np.array_equal(got['image'], want['image'])
    assert np.array_equal(got['idx'], want['idx'])


def test_dict_pipelines_and_python_overrides(local_data):
    source = {'reader': {'path': str(local_data / 'bag'), 'decode_images': False},
              'fns': [{'select': ['idx']}], 'loader': {'batch': 5, 'workers': 0}}
    assert loadr.pipeline(source).batch == 5
    assert loadr.pipeline(source, **{'loader.batch': 3}).batch == 3
    assert loadr.pipeline(source, loader__batch=2).batch == 2
    loader = loadr.pipeline(source, loader={'batch': 6, 'shuffle': False})
    assert (loader.batch, loader.shuffle) == (6, False)
    assert first_batch(loader)['idx'].tolist() == [loader.reader[i]['idx'] for i in range(6)]


def test_paths_in_the_file_are_relative_to_the_file(tmp_path, local_data, monkeypatch):
    path = bag_yaml(tmp_path, local_data)
    elsewhere = tmp_path / 'elsewhere'
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    loader = loadr.pipeline(os.path.relpath(path, elsewhere))
    assert loader.reader.path == str(local_data / 'bag')


def test_override_paths_are_relative_to_the_current_directory(tmp_path, local_data, monkeypatch):
    path = bag_yaml(tmp_path, local_data)
    monkeypatch.chdir(local_data)
    loader = loadr.pipeline(path, **{'reader.path': 'bag_sharded'})
    # samefile: the current directory is the real path when ../shared is a symlink
    assert os.path.samefile(loader.reader.path, local_data / 'bag_sharded')
    assert len(loader.reader) == 13


def test_the_typo_names_file_line_and_the_right_key(tmp_path, local_data):
    path = bag_yaml(tmp_path, local_data, loader='\n  bach: 4\n  workers: 0')
    with pytest.raises(ConfigError) as info:
        loadr.pipeline(path)
    err = info.value
    assert err.message == "unknown key 'bach' in loader (line 10): did you mean 'batch'?"
    assert err.path == str(path) and err.line == 10
    assert str(err) == f"{path}: unknown key 'bach' in loader (line 10): did you mean 'batch'?"


ERRORS = [
    # (the YAML, the exact message expected, the line)
    ("reader: {path: BAG}\nloadr: {batch: 2}\n",
     "unknown section 'loadr' (line 2): did you mean 'loader'?", 2),
    ("reader:\n  path: BAG\n  decode_imags: false\nloader: {batch: 2}\n",
     "unknown key 'decode_imags' in reader (line 3): did you mean 'decode_images'?", 3),
    ("reader: {path: BAG}\nfns:\n  - fllip\nloader: {batch: 2}\n",
     "unknown fn 'fllip' (line 3): did you mean 'flip'? (or an import path "
     "'package.module:function')", 3),
    ("reader: {path: BAG}\nfns:\n  - flip\n  - mypkg.augment:jitter: {p: 1}\nloader: {batch: 2}\n",
     "fn 'mypkg.augment:jitter' not found (line 4): cannot import 'mypkg.augment': "
     "ModuleNotFoundError: No module named 'mypkg' (looked in TMP, CWD and on sys.path; set "
     "PYTHONPATH for a module elsewhere)", 4),
    ("reader: {path: BAG}\nfns:\n  - decode_jpeg:\n      sze: 3\nloader: {batch: 2}\n",
     "unknown argument 'sze' for fn 'decode_jpeg' (line 4): did you mean 'size'?", 4),
    ("reader: {path: BAG}\nfns:\n  - flip: {p: 2}\nloader: {batch: 2}\n",
     "fn 'flip' (line 3): p must be a probability between 0 and 1, got 2", 3),
    ("reader: {path: BAG}\nloader:\n  batch: many\n",
     "loader.batch must be an int, got 'many' (line 3)", 3),
    ("reader: {path: BAG}\nloader:\n  batch: 2\n  shuffle: 3\n",
     "loader.shuffle must be true or false, got 3 (line 4)", 4),
    ("reader: {path: BAG}\nloader:\n  batch: 2\n  workers: -1\n",
     "loader (line 2): workers must be an int >= 0, got -1", 2),
    ("reader: {path: BAG, decode_images: 'yes please'}\nloader: {batch: 2}\n",
     "reader.decode_images must be true or false, got 'yes please' (line 1)", 1),
    ("reader: {path: BAG, format: bagg}\nloader: {batch: 2}\n",
     "unknown reader format 'bagg' (line 1): did you mean 'bag'?", 1),
    ("reader: {path: BAG}\nloader:\n  seed: 1\n",
     'loader needs batch (line 2): add e.g. "batch: 32"', 2),
    ("reader: {path: BAG}\nfns: flip\nloader: {batch: 2}\n",
     'fns must be a list (lines starting with "- "), got a string (line 2)', 2),
    ("reader: {path: BAG}\nfns:\n  - {flip: {}, select: [a]}\nloader: {batch: 2}\n",
     "fn 0 must be a name or a one-key mapping {name: {args}}, got {'flip': {}, 'select': "
     "['a']} (line 3)", 3),
    ("reader: {path: BAG}\nloader:\n  batch: 2\n  seed: 1\n  batch: 3\n",
     "key 'batch' appears twice (lines 3 and 5): keep one", 5),
    ("reader: {path: BAG}\nloader: {batch: 2\n",
     None, 3),     # a YAML syntax error: the parser's own words, with the line
    ("- reader\n- loader\n",
     'a pipeline is a mapping with sections reader, fns, loader; got a list', None),
    ("loader: {batch: 2}\n", "missing section 'reader'", None),
]


@pytest.mark.parametrize('text,message,line', ERRORS)
def test_every_mistake_is_reported_with_line_and_hint(tmp_path, local_data, text, message, line):
    path = tmp_path / 'bad.yaml'
    path.write_text(text.replace('BAG', str(local_data / 'bag')), encoding='utf-8')
    with pytest.raises(ConfigError) as info:
        loadr.pipeline(path)
    err = info.value
    assert err.path == str(path)
    assert err.line == line
    if message is None:
        assert err.message.startswith(f'not valid YAML (line {line}, column ')
    else:
        message = message.replace('TMP', str(tmp_path)).replace('CWD', os.getcwd())
        assert err.message == message


def test_reader_path_and_format_mistakes(tmp_path, local_data):
    path = write(tmp_path / 'p.yaml', 'reader:\n  path: nowhere\nloader: {batch: 1}\n')
    with pytest.raises(ConfigError) as info:
        loadr.pipeline(path)
    assert info.value.message == (f"reader.path 'nowhere' does not exist (line 2): looked for "
                                  f"{tmp_path / 'nowhere'}")
    path = write(tmp_path / 'q.yaml', f'reader:\n  path: {local_data / "bag"}\n  format: gulp\n'
                                      f'loader: {{batch: 1}}\n')
    with pytest.raises(ConfigError, match=r"is not a gulp dataset \(line 3\): it looks like bag"):
        loadr.pipeline(path)
    (tmp_path / 'empty').mkdir()
    with pytest.raises(ConfigError, match=r"'empty' is not a dataset loadr knows \(line 2\)"):
        loadr.pipeline(write(tmp_path / 'r.yaml', 'reader:\n  path: empty\nloader: {batch: 1}\n'))


def test_parse_override_reads_values_as_yaml():
    assert parse_override('loader.batch=128') == ('loader.batch', 128)
    assert parse_override('loader.shuffle=false') == ('loader.shuffle', False)
    assert parse_override('reader.path=data/x y') == ('reader.path', 'data/x y')
    assert parse_override('fns.0.size=[64, 48]') == ('fns.0.size', [64, 48])
    assert parse_override('loader.workers=') == ('loader.workers', None)
    with pytest.raises(ConfigError, match='an override is key=value'):
        parse_override('loader.batch')


def test_overrides_change_fns_by_position_or_name(tmp_path, local_data):
    path = bag_yaml(tmp_path, local_data)
    loader = loadr.pipeline(path, **{'fns.0.size': [16, 24], 'fns.flip.p': 1.0})
    assert loader.fns[0] == F.decode_jpeg(key='image', size=[16, 24])
    assert loader.fns[1] == F.flip(p=1.0)
    assert first_batch(loader)['image'].shape == (4, 16, 24, 3)
    loader = loadr.pipeline(path, **{'fns.2': ['idx']})
    assert loader.fns[2] == F.select(['idx'])


@pytest.mark.parametrize('key,value,message', [
    ('loader.bach', 3, "unknown key 'bach' in loader (from the override loader.bach): did you "
                       "mean 'batch'?"),
    ('loader.batch', 'x', "loader.batch must be an int, got 'x' (from the override "
                          "loader.batch)"),
    ('fns.0.sze', 3, "unknown argument 'sze' for fn 'decode_jpeg' (from the override "
                     "fns.0.decode_jpeg.sze): did you mean 'size'?"),
    ('fns.9.p', 1, "override 'fns.9.p': there are 3 fns, no fn 9"),
    ('fns.flipp.p', 1, "override 'fns.flipp.p': no fn named 'flipp' in fns: did you mean "
                       "'flip'?"),
    ('loadr.batch', 1, "override 'loadr.batch': unknown section 'loadr': did you mean "
                       "'loader'?"),
])
def test_override_mistakes(tmp_path, local_data, key, value, message):
    path = bag_yaml(tmp_path, local_data)
    with pytest.raises(ConfigError) as info:
        loadr.pipeline(path, **{key: value})
    assert info.value.message == message


def test_import_path_fns_bare_factory_and_class(tmp_path, local_data, monkeypatch):
    write(tmp_path / 'myfns.py', """
        def add_one(dp, seed):
            return {**dp, 'idx': dp['idx'] + 1}

        def times(k):
            def fn(dp, seed):
                return {**dp, 'idx': dp['idx'] * k}
            return fn

        class Negate:
            def __call__(self, dp, seed):
                return {**dp, 'idx': -dp['idx']}
        """)
    monkeypatch.syspath_prepend(str(tmp_path))
    source = {'reader': {'path': str(local_data / 'bag')},
              'fns': [{'select': ['idx']}, 'myfns:add_one', {'myfns:times': {'k': 10}},
                      'myfns:Negate'],
              'loader': {'batch': 3, 'workers': 0, 'shuffle': False}}
    idx = [loadr.open(local_data / 'bag')[i]['idx'] for i in range(3)]
    assert first_batch(loadr.pipeline(source))['idx'].tolist() == [-(i + 1) * 10 for i in idx]
    source['fns'][2] = {'myfns:times': {'kk': 10}}
    with pytest.raises(ConfigError, match=r"unknown argument 'kk' for fn 'myfns:times': "
                                          r"did you mean 'k'\?"):
        loadr.pipeline(source)
    source['fns'][2] = 'myfns:nothing'
    with pytest.raises(ConfigError, match=r"fn 'myfns:nothing' not found: 'myfns' has no "
                                          r"'nothing'"):
        loadr.pipeline(source)


MYAUG = """
    import numpy as np

    def jitter(dp, seed):
        return {**dp, 'idx': dp['idx'] + np.random.default_rng(seed).integers(1, 100)}
    """


@pytest.mark.parametrize('where', ['beside the YAML file', 'in the current directory'])
@pytest.mark.parametrize('workers,start', [(0, None), (1, 'fork'), (1, 'spawn')])
def test_fns_by_import_path_import_under_loadr_run_without_pythonpath(tmp_path, local_data,
                                                                       where, workers, start):
    conf, cwd = tmp_path / 'conf', tmp_path / 'work'
    conf.mkdir()
    cwd.mkdir()
    write((conf if where == 'beside the YAML file' else cwd) / 'myaug.py', MYAUG)
    method = '' if start is None else f', start_method: {start}'
    path = write(conf / 'p.yaml', f"""
        reader: {{path: {local_data / 'bag'}}}
        fns: [{{select: [idx]}}, 'myaug:jitter']
        loader: {{batch: 2, workers: {workers}{method}}}
        """)
    env = {k: v for k, v in os.environ.items() if k != 'PYTHONPATH'}
    # The installed script, as users run it: unlike `python -m`, it does not put the
    # current directory on sys.path.
    script = pathlib.Path(sys.executable).parent / 'loadr'
    head = [str(script)] if script.exists() else [sys.executable, '-m', 'loadr.cli']
    done = subprocess.run([*head, 'run', str(path), '--steps', '2'],
                          capture_output=True, text=True, timeout=120, cwd=cwd, env=env)
    assert done.returncode == 0, done.stderr
    assert 'batch: idx int64[2]' in done.stdout


def test_a_fn_that_does_not_import_says_where_it_was_looked_for(tmp_path, local_data,
                                                               monkeypatch):
    elsewhere = tmp_path / 'elsewhere'
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    path = write(tmp_path / 'p.yaml', f"""
        reader: {{path: {local_data / 'bag'}}}
        fns: ['nosuchmodule:jitter']
        loader: {{batch: 2}}
        """)
    before = list(sys.path)
    with pytest.raises(ConfigError) as info:
        loadr.pipeline(path)
    assert info.value.message == (
        f"fn 'nosuchmodule:jitter' not found (line 2): cannot import 'nosuchmodule': "
        f"ModuleNotFoundError: No module named 'nosuchmodule' (looked in {tmp_path}, "
        f"{elsewhere} and on sys.path; set PYTHONPATH for a module elsewhere)")
    assert sys.path == before          # the folders were on the path only while importing


def test_fn_file_arguments_are_relative_to_the_file(tmp_path):
    (tmp_path / 'labels.json').write_text('{"cat": 0, "dog": 1}')
    config = load_config(write(tmp_path / 'p.yaml', """
        fns:
          - label_to_index: {key: label, mapping: labels.json}
        """))
    (fn,) = config.build_fns()
    assert fn({'label': 'dog'})['label'] == 1
    assert fn.mapping == str(tmp_path / 'labels.json')


def test_loader_keys_follow_the_loader_signature():
    params = set(inspect.signature(loadr.Loader).parameters) - {'reader', 'fns'}
    assert set(LOADER_TYPES) == params


def test_configs_demo_yaml_is_the_demo_pipeline():
    from loadr.demo import DEMO_YAML
    assert (CONFIGS / 'demo.yaml').read_text(encoding='utf-8') == DEMO_YAML


@pytest.fixture(scope='module')
def image_bag(tmp_path_factory):
    from loadr.demo import make_images
    path = tmp_path_factory.mktemp('configs') / 'images'
    make_images(str(path), n=8)
    return path


@pytest.mark.parametrize('name,data,shapes', [
    ('demo.yaml', 'image_bag', {'image': (2, 3, 56, 56), 'label': (2,)}),
    ('imagenet_bag.yaml', 'image_bag', {'image': (2, 3, 224, 224), 'label': (2,)}),
    ('video_gulp.yaml', 'gulp', {'frames': (2, 8, 3, 112, 112), 'meta': None}),
    ('ffrecord_msgpack.yaml', 'ffrecord/single.ffr', {'image': (2, 128, 128, 3), 'label': (2,)}),
])
def test_each_example_config_runs_on_small_data(request, local_data, name, data, shapes):
    path = request.getfixturevalue('image_bag') if data == 'image_bag' else local_data / data
    loader = loadr.pipeline(CONFIGS / name, **{'reader.path': str(path), 'loader.batch': 2,
                                               'loader.workers': 0})
    with loader:
        it = iter(loader)
        batches = [next(it) for _ in range(2)]
    for batch in batches:
        assert set(batch) == set(shapes)
        for key, shape in shapes.items():
            if shape is None:
                assert isinstance(batch[key], list) and len(batch[key]) == 2
            else:
                assert batch[key].shape == shape
    assert not np.array_equal(batches[0][next(iter(shapes))], batches[1][next(iter(shapes))])


def test_the_command_prints_one_line_with_file_and_line(tmp_path, local_data):
    path = bag_yaml(tmp_path, local_data, loader='\n  bach: 4')
    done = subprocess.run([sys.executable, '-m', 'loadr.cli', 'run', str(path)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr == (f"loadr: error: {path}: unknown key 'bach' in loader (line 10): "
                           f"did you mean 'batch'?\n")


# -- hostile YAML: alias bombs and deep nesting are ConfigErrors naming file and line ----------


def alias_bomb(levels: int = 9, merge: bool = False) -> tuple[str, int]:
    """A billion-laughs pipeline (each level 9 aliases of the one before) under loader.spec,
    and the line of the first level whose expansion passes the budget of 100,000 values."""
    lines = ['reader: {path: data}', 'loader:', '  batch: 1', '  spec:']
    if merge:
        lines.append('    a: &a {' + ', '.join(f'k{i}: {i}' for i in range(9)) + '}')
    else:
        lines.append('    a: &a [' + ','.join('x' * 9) + ']')
    size, over = 10, None
    for _level, name in enumerate('bcdefghijk'[:levels - 1], start=2):
        refs = ','.join([f'*{chr(ord(name) - 1)}'] * 9)
        lines.append(f'    {name}: &{name} ' + ('{<<: [' + refs + ']}' if merge else f'[{refs}]'))
        size = 1 + 9 * size if not merge else size
        if over is None and not merge and size > 100_000:
            over = len(lines)
    return '\n'.join(lines) + '\n', over


def test_an_alias_bomb_is_refused_at_once_naming_file_and_line(tmp_path):
    text, line = alias_bomb()
    assert len(text) < 480                     # 9**9 values in a few hundred bytes
    path = tmp_path / 'bomb.yaml'
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_config(path)                      # measured without expanding: no time, no memory
    err = info.value
    assert err.path == str(path) and err.line == line and f'(line {line})' in err.message
    assert 'alias' in err.message and 'YAML bomb' in err.message
    # The same with '<<' merge keys, which PyYAML flattens into ever longer mappings.
    text, _ = alias_bomb(merge=True)
    path.write_text(text)
    with pytest.raises(ConfigError, match='YAML bomb') as info:
        load_config(path)
    assert info.value.line is not None
    # and in an -o value (a state file's overrides are parsed the same way)
    flow = '&a [x,x,x,x,x,x,x,x,x]'
    for name in 'bcdefgh':
        flow = f'[{flow}, ' + ', '.join([f'*{chr(ord(name) - 1)}'] * 9) + ']'
        flow = flow.replace('[', f'&{name} [', 1) if name != 'h' else flow
    with pytest.raises(ConfigError, match='YAML bomb'):
        parse_override(f'loader.spec={flow}')


def test_aliases_that_share_a_few_values_still_build(tmp_path, local_data):
    rel = os.path.relpath(local_data / 'bag', tmp_path)
    path = write(tmp_path / 'p.yaml', f'''
        reader: {{path: {rel}, decode_images: false}}
        fns:
          - decode_jpeg: {{key: image, size: &size [16, 24]}}
          - resize: {{key: image, size: *size}}
          - select: &keep [image, idx]
        loader: &loader {{batch: 2, workers: 0}}
        ''')
    batch = first_batch(loadr.pipeline(path))
    assert set(batch) == {'image', 'idx'} and batch['image'].shape == (2, 16, 24, 3)


def test_a_deeply_nested_pipeline_is_a_config_error_not_a_recursion_error(tmp_path):
    path = tmp_path / 'deep.yaml'
    path.write_text('reader: {path: data}\nloader:\n  spec: ' + '[' * 5000 + ']' * 5000 + '\n')
    with pytest.raises(ConfigError, match='nested deeper than') as info:
        load_config(path)
    assert info.value.path == str(path) and info.value.line == 3
    path.write_text('reader:\n' + ''.join('  ' * (i + 1) + f'k{i}:\n' for i in range(2000)))
    with pytest.raises(ConfigError, match='nested deeper than') as info:
        load_config(path)
    assert info.value.line is not None and info.value.line < 100
    path.write_text('reader: {path: data}\nloader: &me {batch: 1, spec: *me}\n')
    with pytest.raises(ConfigError, match='holds it') as info:
        load_config(path)                  # a pipeline that contains itself
    assert info.value.line == 2


def test_the_command_exits_2_on_a_yaml_bomb_and_on_deep_nesting(tmp_path):
    bomb, deep = tmp_path / 'bomb.yaml', tmp_path / 'deep.yaml'
    bomb.write_text(alias_bomb()[0])
    deep.write_text('reader: ' + '[' * 3000 + ']' * 3000 + '\n')
    for path, what in ((bomb, 'YAML bomb'), (deep, 'nested deeper than')):
        done = subprocess.run([sys.executable, '-m', 'loadr.cli', 'run', str(path)],
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 2, done.stderr
        (line,) = done.stderr.splitlines()
        assert line.startswith(f'loadr: error: {path}: ') and what in line
        assert 'RecursionError' not in line


def test_a_reader_path_may_be_a_pattern_of_shards(tmp_path):
    pytest.importorskip('webdataset')
    from .readers.test_webdataset import write_shards
    write_shards(tmp_path / 'shards', shards=2, per=3)
    path = write(tmp_path / 'p.yaml', "reader:\n  path: 'shards/train-{000000..000001}.tar'\n"
                                      "loader: {batch: 2}\nfns:\n  - select: {keys: [cls]}\n")
    with loadr.pipeline(path) as loader:
        assert len(loader.reader) == 6 and sorted(next(iter(loader))) == ['cls']


@pytest.mark.parametrize('text,line,pattern', [
    ('reader:\n  path: shards/{a,b}.tar\n', None, None),         # not at the start: a string
    ('reader:\n  path: {a,b}.tar\n', 2, '{a,b}.tar'),
    ('reader:\n  path: {000..009}.tar\n', 2, '{000..009}.tar'),
    ('reader:\n  path: {train,val}/x.tar\n', 2, '{train,val}/x.tar'),
    ('reader: {path: {a,b}.tar}\n', 1, '{a,b}.tar'),                 # in a flow mapping
])
def test_an_unquoted_brace_pattern_gets_the_advice_to_quote_it(tmp_path, text, line, pattern):
    path = write(tmp_path / 'p.yaml', text + 'loader: {batch: 2}\n')
    with pytest.raises(ConfigError) as info:
        loadr.pipeline(path)
    message = info.value.message
    if pattern is None:
        assert message.startswith("reader.path 'shards/{a,b}.tar' names no file"), message
        return
    assert message.startswith(f'not valid YAML (line {line}, column ') and info.value.line == line
    assert message.endswith(f"YAML reads a value that starts with {{ as a mapping: quote the "
                            f"pattern, '{pattern}'"), message


@pytest.mark.parametrize('value,pattern', [('{a,b}', '{a,b}'), ('{000..009}', '{000..009}')])
def test_a_brace_pattern_read_as_a_mapping_gets_the_advice_to_quote_it(tmp_path, value,
                                                                       pattern):
    path = write(tmp_path / 'p.yaml', f'reader:\n  path: {value}\nloader: {{batch: 2}}\n')
    with pytest.raises(ConfigError) as info:
        loadr.pipeline(path)
    assert info.value.message.endswith(
        f"(line 2): YAML reads an unquoted {pattern} as a mapping: quote the pattern, "
        f"'{pattern}'"), info.value.message
    # Quoted as advised, it is a pattern (of files that are not there: said so).
    write(tmp_path / 'p.yaml', f"reader:\n  path: '{value}'\nloader: {{batch: 2}}\n")
    with pytest.raises(ConfigError, match='names no file to read'):
        loadr.pipeline(path)


def test_a_mapping_that_is_no_brace_pattern_gets_no_such_advice(tmp_path):
    path = write(tmp_path / 'p.yaml', 'reader:\n  path: {a: 1}\nloader: {batch: 2}\n')
    with pytest.raises(ConfigError) as info:
        loadr.pipeline(path)
    assert 'must be a path' in info.value.message and 'quote the' not in info.value.message

#!/bin/bash
# The remote and decode benchmarks on a second machine that has no package index
# (a lent 16-core machine): `prepare` gathers here what it lacks into .devkit/ (ignored
# by git), `run` (there, from the repository root) installs it and runs the figures of
# BENCHMARKS.md's "16-core" rows, writing them under $OUT (default ./devkit-out).
#
#   bash benchmarks/devkit.sh prepare        # here: Debian/Ubuntu with nginx and libjpeg-dev
#   bash benchmarks/devkit.sh run            # there: python3 (3.12) with numpy, Pillow, torch
set -u
cd "$(dirname "$0")/.."
KIT=.devkit
case "${1:-}" in
prepare)
    grep -qx '/.devkit/' .git/info/exclude 2>/dev/null || { mkdir -p .git/info; echo /.devkit/ >> .git/info/exclude; }
    mkdir -p $KIT/whl $KIT/nginx/lib $KIT/bin $KIT/jpeg/include $KIT/jpeg/lib
    PY=${PYTHON:-python3}
    plat="--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64"
    # loadr's own dependencies the machine lacks, and moto + s3fs for --s3 (pure Python or abi3).
    $PY -m pip download -q --no-deps --only-binary=:all: --python-version ${PYVER:-3.12} \
        --implementation cp $plat -d $KIT/whl pyzmq simplejpeg isal multiprocess dill moto \
        s3fs aiobotocore aioitertools boto3 botocore s3transfer jmespath xmltodict responses \
        flask flask-cors itsdangerous blinker cryptography cffi pycparser fsspec || exit 1
    cp /usr/sbin/nginx $KIT/nginx/nginx.real || exit 1
    for l in $(ldd /usr/sbin/nginx | awk '/=>/ {print $3}' | grep -v libc.so); do cp -L "$l" $KIT/nginx/lib/; done
    printf '#!/bin/sh\nK=$(dirname "$(dirname "$(readlink -f "$0")")")/nginx\nldd "$K/nginx.real" | grep -q "not found" && export LD_LIBRARY_PATH="$K/lib"\nexec "$K/nginx.real" "$@"\n' > $KIT/bin/nginx
    chmod +x $KIT/bin/nginx
    cp /usr/include/jpeglib.h /usr/include/jmorecfg.h /usr/include/jerror.h $KIT/jpeg/include/
    cp /usr/include/*/jconfig.h $KIT/jpeg/include/ 2>/dev/null || cp /usr/include/jconfig.h $KIT/jpeg/include/
    cp -L "$(ldconfig -p | awk '/libjpeg.so.62 .*x86-64/ {print $NF; exit}')" $KIT/jpeg/lib/libjpeg.so.62
    cp $KIT/jpeg/lib/libjpeg.so.62 $KIT/jpeg/lib/libjpeg.so
    du -sh $KIT ;;
run)
    OUT=${OUT:-$PWD/devkit-out}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $KIT/whl/*.whl || exit 1
    export PYTHONPATH=/tmp/site:$PWD PATH=$PWD/$KIT/bin:$PATH
    mkdir -p /var/log/nginx /var/lib/nginx 2>/dev/null
    CFLAGS="-I$PWD/$KIT/jpeg/include" LDFLAGS="-L$PWD/$KIT/jpeg/lib" \
        python3 setup.py -q build_ext --inplace > "$OUT/build.txt" 2>&1
    ldd loadr/_jpegregion*.so 2>/dev/null | grep -q 'not found' && export LD_LIBRARY_PATH=$PWD/$KIT/jpeg/lib
    for args in "1 20 --s3" "2 20 --s3" "1 50" "2 50"; do
        set -- $args
        timeout 75 python3 -m benchmarks.remote --images 960 --shardlen 32 --batch 32 --workers $1 \
            --open-shards 0 --runs 2 --skip 3 --delay-ms $2 ${3:-} > "$OUT/remote-w$1-d$2.txt" 2>&1
    done
    timeout 100 python3 -m benchmarks.decode --runs 2 > "$OUT/decode.txt" 2>&1
    timeout 120 python3 -m benchmarks.decode_loaders --workers 16 --batches 48 --runs 1 \
        > "$OUT/decode_loaders.txt" 2>&1
    grep -h -A4 'Medians of' "$OUT"/remote-*.txt; grep '^|' "$OUT/decode_loaders.txt" ;;
*)
    echo "usage: bash benchmarks/devkit.sh prepare|run" >&2; exit 2 ;;
esac

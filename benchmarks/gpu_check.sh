#!/usr/bin/env bash
# CUDA check of the Warp paths (recorder with 4096 worlds, Warp replay throughput), for a machine
# with an NVIDIA GPU and Python 3.12 but none of this project's packages.
#
# Preparing the payload on a machine with PyPI access (warp-lang's wheel is ~150 MB, so warp.so is
# compressed separately and split to fit transfers of < 64 MiB):
#   pip install --target site --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
#     --platform any mujoco==4.0.0 mujoco-core==4.0.0 mujoco-warp==4.0.0 warp-lang==1.19.0 zarr==3.1.6 \
#     numcodecs==0.16.6 donfig google-crc32c jsonschema jsonschema-specifications referencing rpds-py \
#     pytest pluggy iniconfig packaging
#   mv site/warp/bin/warp.so . && rm site/warp/bin/warp-clang.so      # CPU JIT not needed on CUDA
#   zstd -19 --long=27 warp.so && split -b 58m warp.so.zst warp.so.zst.part
#   tar -C site -cf - . | zstd -19 -o .gpu2/site.tar.zst
#   pip download --no-deps --only-binary=:all: --python-version 3.12 -d .gpu2 zstandard
# Carry .gpu1/warp.so.zst.partaa in one call (copied to /tmp/g), then .gpu2/ (partab, site.tar.zst,
# the zstandard wheel) in the next, and run: bash benchmarks/gpu_check.sh
set -u
T0=$(date +%s)
log() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
mkdir -p /tmp/site /tmp/z
python3 -m pip install -q --no-index --no-deps --target /tmp/z .gpu2/zstandard-*.whl || exit 1
export PYTHONPATH=/tmp/z
PART_A=/tmp/g/warp.so.zst.partaa; [ -f "$PART_A" ] || PART_A=.gpu1/warp.so.zst.partaa
python3 - "$PART_A" <<'PY' || exit 1
import sys, io, tarfile, zstandard
d = zstandard.ZstdDecompressor(max_window_size=2**31)
with open(".gpu2/site.tar.zst", "rb") as f, d.stream_reader(f) as r:
    tarfile.open(fileobj=r, mode="r|").extractall("/tmp/site")
class Cat(io.RawIOBase):
    def __init__(self, paths): self.fs = [open(p, "rb") for p in paths]
    def readable(self): return True
    def readinto(self, b):
        while self.fs:
            n = self.fs[0].readinto(b)
            if n: return n
            self.fs.pop(0)
        return 0
with d.stream_reader(io.BufferedReader(Cat([sys.argv[1], ".gpu2/warp.so.zst.partab"]))) as r, open("/tmp/site/warp/bin/warp.so", "wb") as o:
    while chunk := r.read(1 << 24): o.write(chunk)
PY
log "unpacked"
export PYTHONPATH=/tmp/site:$PWD/src WARP_CACHE_PATH=/tmp/warpcache PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import warp as wp, mujoco, mujoco_warp, zarr, mjarchive; wp.init(); print('cuda devices', wp.get_cuda_devices(), 'mujoco', mujoco.__version__, 'zarr', zarr.__version__)" || exit 1
log "imports ok"
# Issue 28's order (each step bounded, so the later ones still run if one hangs; ~10 min in all):
# 1. Warp recorder, 4096 worlds, 64 recorded: record() vs a bare on-device gather + host copy, and the
#    step-loop slowdown (goals: <= 1.5x, <= 3 %).
timeout 200 python3 benchmarks/bench_recorder.py --device cuda --nworld 4096 --selected 64 --steps 600 --repeats 2 2>&1 | tee $OUT/recorder.txt
log "recorder done"
# 2. torch-CUDA and JAX-GPU array paths, where the payload carries them (CUDA builds of torch and
#    jaxlib are GBs: more than the 64 MiB a transfer takes; say so rather than fail).
LIBS=$(python3 -c "import importlib.util as u; print(','.join(l for l in ('jax', 'torch') if u.find_spec(l)))")
if [ -n "$LIBS" ]; then
  timeout 150 python3 benchmarks/bench_arrays.py --device cuda --nworld 4096 --selected 64 --repeats 3 --libraries "$LIBS" 2>&1 | tee $OUT/arrays.txt
else
  echo "arrays: neither jax nor torch in the payload; the torch-CUDA / JAX-GPU rows did not run" | tee $OUT/arrays.txt
fi
log "arrays done"
# 3. Variants capture at 1 % resets per frame, 4096 worlds.
timeout 120 python3 benchmarks/bench_variants.py --device cuda --nworld 4096 --repeats 2 2>&1 | tee $OUT/variants.txt
log "variants done"
# 4. Warp replay frames/s at 240x320 vs a raw mjw.render loop (goal >= 0.95), then free, tracking and
#    scene cameras.
timeout 150 python3 benchmarks/bench_replay.py --only warp --device cuda --warp-frames 1024 --warp-size 240x320 --repeats 2 2>&1 | tee $OUT/replay.txt
timeout 120 python3 benchmarks/bench_views.py --device cuda --only warp --only scene --warp-size 240x320 --repeats 2 2>&1 | tee $OUT/views.txt
log "replay done"
# 5. The Warp tests of tests/record and tests/replay, where the payload carries pytest. They pin Warp's
#    "cpu" device (no test selects CUDA yet): this checks the payload and the wheels, not CUDA kernels.
if python3 -c "import pytest" 2>/dev/null; then
  timeout 120 python3 -m pytest -q -x -k warp tests/record tests/replay 2>&1 | tail -40 | tee $OUT/tests.txt
else
  echo "tests: pytest not in the payload" | tee $OUT/tests.txt
fi
log "all done"

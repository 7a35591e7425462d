#!/usr/bin/env bash
# Builds the payload that benchmarks/gpu_check.sh unpacks on a GPU machine with no package index:
# .gpu/payload.tar.xz.part* (ignored by git), each small enough for one device call to carry beside the
# working tree (64 MiB in all). Run it here, from the repository root, where PyPI is reachable (~5 minutes).
#
# The GPU machine's image has Python 3.12 with numpy, torch, JAX (CUDA), pytest, imageio, tqdm, etils and
# absl-py, but none of this project's packages: these are installed for that Python, without their
# dependencies (the image's, or listed here). warp-lang's CPU JIT is left out (CUDA compiles with NVRTC).
# The archive is xz, which Python's own tarfile reads there.
#
# Then, one device call per part but the last, each carrying that part only and copying it aside:
#   mkdir -p /tmp/g && cp .gpu/payload.tar.xz.partaa /tmp/g/
# and at once (a machine stays warm 30 s after a call) the last, carrying the last part and .gpu/gl (the
# GL loaders, Debian's .deb files, for MuJoCo's own renderer through the NVIDIA driver's EGL):
#   bash benchmarks/gpu_check.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PACKAGES=(
    mujoco==4.0.1 mujoco-core==4.0.1 mujoco-warp==4.0.0 warp-lang==1.19.0
    zarr==3.1.6 numcodecs==0.16.6 donfig==0.8.1.post1 google-crc32c==1.9.0
    jsonschema==4.26.0 jsonschema-specifications==2025.9.1 referencing==0.37.0 rpds-py==2026.9.1
    imageio-ffmpeg==0.8.1 PyOpenGL==3.1.10 glfw==2.11.0
)
PART_BYTES=$((58 * 2**20))
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
python3 -m pip install -q --target "$scratch/site" --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform any "${PACKAGES[@]}"
rm -f "$scratch/site/warp/bin/warp-clang.so"
find "$scratch/site" -name __pycache__ -prune -exec rm -rf {} +
rm -rf .gpu && mkdir .gpu
tar -C "$scratch/site" -cf - . | xz -9e -T0 > "$scratch/payload.tar.xz"
split -b "$PART_BYTES" "$scratch/payload.tar.xz" .gpu/payload.tar.xz.part
# The GL loaders the device README names (the image has none); without them step 5 leaves out the
# comparison of Warp's renders with MuJoCo's renderer, and says so.
apt_opts=(-oAPT::Architecture=amd64 -oAPT::Architectures=amd64 -oDir::State::Lists="$scratch/apt")
mkdir -p "$scratch/apt/partial" .gpu/gl
if apt-get "${apt_opts[@]}" -qq update && (cd .gpu/gl && apt-get "${apt_opts[@]}" -qq download \
        libegl1 libglvnd0 libopengl0 libgl1 libglx0 libgles2); then
    ls .gpu/gl
else
    echo "GL loaders not downloaded: the device check will leave out the comparison with MuJoCo's renderer" >&2
fi
ls -l .gpu

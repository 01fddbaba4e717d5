#!/usr/bin/env bash
# Builds bench/torch/torch_rows.cpp against the libtorch of the GPU machine's
# PyTorch (one build per part: device caching allocator, caching host
# allocator under either API name, event pool) and runs each build that
# compiled. Prints markdown rows; each build's compiler output goes to
# $OUT/<part>.build.log (OUT defaults to ./torch-rows-out).
#
# Usage (on the GPU machine): bash scripts/torch-rows.sh
#   TORCH_PYTHON  the Python whose `torch` to use (default
#                 /opt/torch/.venv/bin/python)
set -u
cd "$(dirname "$0")/.."
py=${TORCH_PYTHON:-/opt/torch/.venv/bin/python}
out=${OUT:-./torch-rows-out}
mkdir -p "$out"
tdir=$("$py" -c 'import os, torch; print(os.path.dirname(torch.__file__))') || exit 2
abi=$("$py" -c 'import torch; print(int(torch.compiled_with_cxx11_abi()))')
echo "torch $("$py" -c 'import torch; print(torch.__version__)') at $tdir (C++11 ABI: $abi)"
cuda_inc=${CUDA_HOME:-/usr/local/cuda}/include
flags=(-O2 -std=c++17 "-D_GLIBCXX_USE_CXX11_ABI=$abi" "-I$tdir/include"
  "-I$tdir/include/torch/csrc/api/include" "-I$cuda_inc")
# --no-as-needed: libtorch_cuda registers PyTorch's CUDA hooks when it is
# loaded, and the program calls none of its symbols directly. The CUDA
# runtime is the one PyTorch ships (its pip `nvidia` package), which the
# inline functions of its headers call.
cudart=$(ls "$tdir"/../nvidia/*/lib/libcudart.so* 2>/dev/null | head -1)
libs=("-L$tdir/lib" "-Wl,-rpath,$tdir/lib" -Wl,--no-as-needed -lc10 -lc10_cuda -ltorch_cpu
  -ltorch_cuda -ltorch -Wl,--as-needed)
if [[ -n $cudart ]]; then
  libs+=("$cudart" "-Wl,-rpath,$(dirname "$cudart")")
fi
# The header that declares PyTorch's event pool, if this version has one.
event_header=$(grep -rl "class CUDAEventPool" "$tdir/include/ATen/cuda" "$tdir/include/c10/cuda" 2>/dev/null | head -1)
echo "event pool header: ${event_header:-none}"

build() {
  local name=$1
  shift
  if g++ "${flags[@]}" "$@" bench/torch/torch_rows.cpp -o "$out/$name" "${libs[@]}" \
    >"$out/$name.build.log" 2>&1; then
    echo "built $name"
  else
    echo "not built: $name (last lines of $out/$name.build.log:)"
    grep -m5 "error" "$out/$name.build.log"
  fi
}
build device -DPART_DEVICE &
build pinned-at-cuda -DPART_PINNED -DPINNED_API=1 &
build pinned-host-allocator -DPART_PINNED -DPINNED_API=2 &
if [[ -n $event_header ]]; then
  build events -DPART_EVENTS "-DEVENT_POOL_HEADER=\"$event_header\"" &
fi
wait
echo "| row | threads | ns per round (events: per get+put) |"
echo "|---|---|---|"
ran_pinned=0
for name in device pinned-at-cuda pinned-host-allocator events; do
  [[ -x $out/$name ]] || continue
  if [[ $name == pinned-* ]]; then
    [[ $ran_pinned == 1 ]] && continue
    ran_pinned=1
  fi
  timeout 120 "$out/$name" || echo "($name exited $?)"
done

"""What a reduction through distributed shared memory would cost, next to the L2 round trip the MLA merge pays.

The fused MLA decode at B=1 writes each program's 64 KB partial to global memory and reads a share back after a
barrier (benchmarks/sm_traffic_probe.py times that: about 5.3 us). Within a thread-block cluster the same exchange can
go from shared memory to shared memory. Triton 3.6's Gluon cannot express that (no cluster-shared loads or stores,
no shared-memory addresses for mapa), so this probe is plain CUDA, built with nvcc into a small library and called
through ctypes; it is a measurement, not a kernel of ours.

Each CTA of a cluster of C holds a block (16, 32 or 64 KB) in shared memory and sends slice j of it to cluster rank j
(all but its own), as a reduction that leaves each rank one C-th of the columns would; then cluster.sync(). Stamps,
in us after the CTA's own start of the exchange: the stores issued, and the cluster barrier passed. 128 CTAs, one
per SM (the shared memory asked for keeps it so).

Prints one line per case and writes $OUT/dsmem_probe.json. Run (H200): PYTHONPATH=. python benchmarks/dsmem_probe.py
"""

import ctypes
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

SOURCE = r"""
#include <cooperative_groups.h>
#include <cuda_runtime.h>
namespace cg = cooperative_groups;

__device__ __forceinline__ unsigned long long now() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

__global__ void exchange(unsigned long long* stamps, float* sink, int words) {
    extern __shared__ uint4 smem[];
    uint4* mine = smem;
    uint4* recv = smem + words;
    cg::cluster_group cluster = cg::this_cluster();
    const unsigned rank = cluster.block_rank(), size = cluster.num_blocks();
    for (int i = threadIdx.x; i < words; i += blockDim.x) mine[i] = make_uint4(i, rank, blockIdx.x, 1);
    cluster.sync();
    const unsigned long long t0 = now();
    const int slice = words / size;
    for (unsigned j = 1; j < size; ++j) {
        const unsigned peer = (rank + j) % size;
        uint4* dst = cluster.map_shared_rank(recv, peer) + rank * slice;
        const uint4* src = mine + peer * slice;
        for (int i = threadIdx.x; i < slice; i += blockDim.x) dst[i] = src[i];
    }
    const unsigned long long t1 = now();
    cluster.sync();
    const unsigned long long t2 = now();
    float acc = 0.f;
    for (int i = threadIdx.x; i < words; i += blockDim.x) acc += recv[i].x;
    if (acc == -1.f) sink[0] = acc;
    if (threadIdx.x == 0) {
        stamps[blockIdx.x * 3 + 0] = t0;
        stamps[blockIdx.x * 3 + 1] = t1;
        stamps[blockIdx.x * 3 + 2] = t2;
    }
}

extern "C" int run(int blocks, int cluster, int kb, unsigned long long* stamps, float* sink) {
    const int words = kb * 1024 / 16;
    const size_t shared = 2 * (size_t)kb * 1024;
    cudaError_t err = cudaFuncSetAttribute(exchange, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)shared);
    if (err != cudaSuccess) return (int)err;
    err = cudaFuncSetAttribute(exchange, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
    if (err != cudaSuccess) return (int)err;
    cudaLaunchConfig_t config = {};
    config.gridDim = dim3(blocks);
    config.blockDim = dim3(256);
    config.dynamicSmemBytes = shared;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = cluster;
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = 1;
    config.attrs = attr;
    config.numAttrs = 1;
    err = cudaLaunchKernelEx(&config, exchange, stamps, sink, words);
    if (err != cudaSuccess) return (int)err;
    return (int)cudaDeviceSynchronize();
}
"""


def build(folder: Path) -> ctypes.CDLL:
    nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    src = folder / "dsmem_probe.cu"
    lib = folder / "libdsmem_probe.so"
    src.write_text(SOURCE)
    subprocess.run([nvcc, "-O3", "-arch=sm_90a", "-shared", "-Xcompiler", "-fPIC", "-o", str(lib), str(src)],
                   check=True, capture_output=True, text=True)
    return ctypes.CDLL(str(lib))


def measure(lib, cluster: int, kb: int, blocks: int = 128, repeats: int = 5) -> dict:
    stamps = torch.zeros(blocks * 3, dtype=torch.int64, device="cuda")
    sink = torch.zeros(1, device="cuda")
    for _ in range(repeats):
        err = lib.run(blocks, cluster, kb, ctypes.c_void_p(stamps.data_ptr()), ctypes.c_void_p(sink.data_ptr()))
        if err:
            return {"error": f"cuda error {err}"}
    rel = (stamps.view(blocks, 3) - stamps.view(blocks, 3)[:, :1]).float() / 1000.0  # after this CTA's own start
    return {name: {"median": round(float(rel[:, i].median()), 2), "max": round(float(rel[:, i].max()), 2)}
            for i, name in ((1, "issued"), (2, "cluster_synced"))}


def main() -> int:
    if not torch.cuda.is_available():
        print("dsmem_probe: needs a Hopper GPU", file=sys.stderr)
        return 2
    torch.cuda.init()
    with tempfile.TemporaryDirectory() as tmp:
        try:
            lib = build(Path(tmp))
        except (OSError, subprocess.CalledProcessError) as exc:
            print(f"dsmem_probe: nvcc build failed: {getattr(exc, 'stderr', exc)}", file=sys.stderr)
            return 2
        result = {"gpu": torch.cuda.get_device_name(), "cases": {}}
        for cluster in (2, 4, 8):
            for kb in (16, 32, 64):
                key = f"cluster {cluster}, {kb} KB a CTA"
                result["cases"][key] = case = measure(lib, cluster, kb)
                print(f"{key:24s} {json.dumps(case)}", flush=True)
    (Path(os.environ.get("OUT", ".")) / "dsmem_probe.json").write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

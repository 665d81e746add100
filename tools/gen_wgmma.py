#!/usr/bin/env python3
"""gen_wgmma.py : write the wgmma instruction wrappers of the sm90 kernels.

A wgmma with an m64nNk16 shape names N/2 fp32 accumulator registers per thread
in its operand list, so each N needs its own inline-asm statement. The N values
come from the forward tuning tables FC_SM90_FWD_TILES, FC_SM90WS_FWD_TILES and
FC_SM90WS_FWD_SHORT_TILES in src/cuda/traits.h: every key-tile width Bc (S = Q K^T, both operands from shared memory) and every head
dim D (O += P V, P from registers). For each N and dtype it writes to
src/cuda/common/wgmma_ops.cuh

    fc_wgmma_ss<N, T>(d, desc_a, desc_b, scale_d)   A, B from shared memory,
                                                    both K-major
    fc_wgmma_rs<N, T>(d, a, desc_b, scale_d)        A from registers (the
                                                    mma.m16n8k16 A fragment
                                                    of the warp's 16 rows), B
                                                    MN-major (transposed)

and, for the backward's table FC_SM90_BWD_TILES (rows D, Br, Bc, stages; per
warpgroup S^T = K Q^T has N = Br (Bc = 128) or Br / 2 (Bc = 64), dV and dK
N = D from registers (Bc = 128) or D / 2 from shared memory (Bc = 64), dQ
N = D * Br / 128):

    fc_wgmma_ss_mn<N, T>(d, desc_a, desc_b, scale_d) A, B from shared memory,
                                                    both MN-major (dQ = dS K
                                                    from dS^T and K as stored)
    fc_wgmma_ss_bmn<N, T>(d, desc_a, desc_b, scale_d) A K-major, B MN-major,
                                                    both from shared memory
                                                    (dV = P^T dO, dK = dS^T Q
                                                    with P^T, dS^T stored)

d += A B when scale_d != 0, d = A B when scale_d == 0. The output starts
"generated; do not edit". Run from anywhere:
    python3 tools/gen_wgmma.py           write it when it differs
    python3 tools/gen_wgmma.py --check   write nothing; exit 1 when it is not
                                         current (test.sh, CI)
"""
import pathlib
import re
import sys

import generated

ROOT = pathlib.Path(__file__).resolve().parent.parent
TRAITS = ROOT / "src" / "cuda" / "traits.h"
OUT = ROOT / "src" / "cuda" / "common" / "wgmma_ops.cuh"
DTYPES = [("bf16", "__nv_bfloat16"), ("f16", "__half")]


# Key tiles a tuning build (bench/tune.sh) may try on top of the table's.
TUNING_BC = [64, 96, 128, 160, 192]


def widths():
    """N of ss (every Bc) and rs (every D) the forward tables of sm90 and sm90ws need."""
    text = TRAITS.read_text()
    rows = []
    for table in ("FC_SM90_FWD_TILES", "FC_SM90WS_FWD_TILES", "FC_SM90WS_FWD_SHORT_TILES"):
        m = re.search(rf"#define {table}\(X\)(.*?)\n#endif", text, re.S)
        if not m:
            sys.exit(f"{TRAITS}: {table}(X) not found")
        rows += re.findall(r"X\(\s*(\d+)\s*,\s*\d+\s*,\s*(\d+)\s*,", m.group(1))
    ns = set(TUNING_BC)
    for d, bc in rows:
        ns.update((int(d), int(bc)))
    for n in ns:
        if n % 16 or not 16 <= n <= 256:
            sys.exit(f"{TRAITS}: wgmma N={n} must be a multiple of 16 in 16..256")
    return sorted(ns)


def bwd_widths():
    """(N of ss and rs, N of ss_mn, N of ss_bmn) the backward's table needs."""
    text = TRAITS.read_text()
    m = re.search(r"#define FC_SM90_BWD_TILES\(X\)(.*?)\n#endif", text, re.S)
    if not m:
        sys.exit(f"{TRAITS}: FC_SM90_BWD_TILES(X) not found")
    rows = [tuple(int(v) for v in r) for r in
            re.findall(r"X\(\s*(\d+)\s*,\s*(\d+)\s*,\s*(\d+)\s*,\s*\d+\s*\)", m.group(1))]
    if not rows:
        sys.exit(f"{TRAITS}: FC_SM90_BWD_TILES(X) has no rows")
    ns, ns_mn, ns_bmn = set(), set(), set()
    for d, br, bc in rows:
        split = bc == 64  # the warpgroups split S^T by queries, dK and dV by columns
        ns.add(br // 2 if split else br)
        (ns_bmn if split else ns).add(d // 2 if split else d)
        ns_mn.add(d * br // 128)
    return ns, ns_mn, ns_bmn


def regs(n, first=0):
    return ", ".join(f"%{first + i}" for i in range(n))


def outs(n):
    return ", ".join(f'"+f"(d[{i}])' for i in range(n))


def ss(n, ptx, ty, name="fc_wgmma_ss", trans="0, 0"):
    r = n // 2
    return (
        f"template <>\n__device__ __forceinline__ void {name}<{n}, {ty}>(float (&d)[{r}], uint64_t a,\n"
        f"        uint64_t b, int scale_d) {{\n"
        f'    asm volatile(\n        "{{\\n.reg .pred p;\\nsetp.ne.b32 p, %{r + 2}, 0;\\n"\n'
        f'        "wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{ptx}.{ptx} "\n'
        f'        "{{{regs(r)}}}, "\n'
        f'        "%{r}, %{r + 1}, p, 1, 1, {trans};\\n}}\\n"\n'
        f"        : {outs(r)}\n"
        f'        : "l"(a), "l"(b), "r"(scale_d));\n}}\n\n')


def rs(n, ptx, ty):
    r = n // 2
    return (
        f"template <>\n__device__ __forceinline__ void fc_wgmma_rs<{n}, {ty}>(float (&d)[{r}],\n"
        f"        const uint32_t (&a)[4], uint64_t b, int scale_d) {{\n"
        f'    asm volatile(\n        "{{\\n.reg .pred p;\\nsetp.ne.b32 p, %{r + 5}, 0;\\n"\n'
        f'        "wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{ptx}.{ptx} "\n'
        f'        "{{{regs(r)}}}, "\n'
        f'        "{{{regs(4, r)}}}, %{r + 4}, p, 1, 1, 1;\\n}}\\n"\n'
        f"        : {outs(r)}\n"
        f'        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(scale_d));\n}}\n\n')


def header(ns, ns_mn, ns_bmn):
    out = ["// generated; do not edit. Written by tools/gen_wgmma.py from src/cuda/traits.h.\n",
           "// The wgmma.mma_async wrappers of the sm90 kernels, one per (N, dtype): see\n",
           "// tools/gen_wgmma.py for the operand conventions and wgmma.cuh for the rest.\n",
           "#ifndef FLASHC_CUDA_WGMMA_OPS_CUH\n#define FLASHC_CUDA_WGMMA_OPS_CUH\n\n",
           "#include <cuda_bf16.h>\n#include <cuda_fp16.h>\n#include <stdint.h>\n\n",
           "template <int N, typename T>\n",
           "__device__ void fc_wgmma_ss(float (&d)[N / 2], uint64_t a, uint64_t b, int scale_d);\n",
           "template <int N, typename T>\n",
           "__device__ void fc_wgmma_rs(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t b, int scale_d);\n",
           "template <int N, typename T>\n",
           "__device__ void fc_wgmma_ss_mn(float (&d)[N / 2], uint64_t a, uint64_t b, int scale_d);\n",
           "template <int N, typename T>\n",
           "__device__ void fc_wgmma_ss_bmn(float (&d)[N / 2], uint64_t a, uint64_t b, int scale_d);\n\n"]
    for n in ns:
        out.append(f"// ---- N = {n} ----\n")
        for ptx, ty in DTYPES:
            out.append(ss(n, ptx, ty))
            out.append(rs(n, ptx, ty))
            if n in ns_mn:
                out.append(ss(n, ptx, ty, "fc_wgmma_ss_mn", "1, 1"))
            if n in ns_bmn:
                out.append(ss(n, ptx, ty, "fc_wgmma_ss_bmn", "0, 1"))
    out.append("#endif  // FLASHC_CUDA_WGMMA_OPS_CUH\n")
    return "".join(out)


def generate():
    ns, ns_mn, ns_bmn = bwd_widths()
    return {OUT: header(sorted(set(widths()) | ns | ns_mn | ns_bmn), ns_mn, ns_bmn)}, []


if __name__ == "__main__":
    generated.main(__doc__, generate)

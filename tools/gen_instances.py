#!/usr/bin/env python3
"""gen_instances.py : write the CUDA kernel instances and their dispatch lists.

The head dims come from the one tuning table, src/cuda/traits.h: its
FC_SM80_FWD_TILES rows for the sm80 family and FC_SM90_FWD_TILES rows for the
sm90 family, so adding a row there and re-running this script is all a new head
dim needs. For each family F, head dim D and dtype it writes

    src/cuda/F/inst/fwd_d{D}_{bf16,fp16}.cu   the explicit instantiations of
                                             F_fwd_launch<D, T, causal>
                                             for causal = false, true
    src/cuda/F/inst/instances.h              their extern declarations and
                                             FC_F_FWD_HEADDIMS(X), the list
                                             launch.cu's switch is built from

Every output starts "generated; do not edit". Run from anywhere:
    python3 tools/gen_instances.py
"""
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
TRAITS = ROOT / "src" / "cuda" / "traits.h"
FAMILIES = ["sm80", "sm90"]
DTYPES = [("bf16", "__nv_bfloat16"), ("fp16", "__half")]
HEADER = "// generated; do not edit. Written by tools/gen_instances.py from src/cuda/traits.h.\n"
LAUNCH_ARGS = "const fc_cuda_fwd_params &, dim3, cudaStream_t"


def head_dims(fam):
    text = TRAITS.read_text()
    table = f"FC_{fam.upper()}_FWD_TILES"
    m = re.search(rf"#define {table}\(X\)(.*?)\n(\n|#endif)", text, re.S)
    if not m:
        sys.exit(f"{TRAITS}: {table}(X) not found")
    dims = [int(d) for d in re.findall(r"X\(\s*(\d+)\s*,", m.group(1))]
    if not dims or dims != sorted(set(dims)):
        sys.exit(f"{TRAITS}: head dims must be listed once each, ascending: {dims}")
    return dims


def instance_file(fam, d, ty):
    lines = [HEADER, '#include "../fwd_kernel.cuh"\n', "\n"]
    for causal in ("false", "true"):
        lines.append(f"template cudaError_t {fam}_fwd_launch<{d}, {ty}, {causal}>({LAUNCH_ARGS});\n")
    return "".join(lines)


def instances_h(fam, dims):
    F = fam.upper()
    out = [HEADER,
           f"// The {fam} forward instances that exist, for launch.cu. A build trimmed with\n",
           f"// FLASHC_CUDA_HEADDIMS (or without the family's arch) defines FC_{F}_HD_<D>=0\n",
           "// for the head dims it leaves out.\n",
           f"#ifndef FLASHC_CUDA_{F}_INSTANCES_H\n#define FLASHC_CUDA_{F}_INSTANCES_H\n\n",
           "#include <cuda_bf16.h>\n#include <cuda_fp16.h>\n#include <cuda_runtime.h>\n\n",
           '#include "../../params.h"\n\n',
           "template <int D, typename T, bool kCausal>\n",
           f"cudaError_t {fam}_fwd_launch(const fc_cuda_fwd_params &p, dim3 grid, cudaStream_t stream);\n\n"]
    for d in dims:
        out.append(f"#ifndef FC_{F}_HD_{d}\n#define FC_{F}_HD_{d} 1\n#endif\n")
        out.append(f"#if FC_{F}_HD_{d}\n#define FC_{F}_FWD_HD_{d}_(X) X({d})\n")
        for _, ty in DTYPES:
            for causal in ("false", "true"):
                out.append(f"extern template cudaError_t {fam}_fwd_launch<{d}, {ty}, {causal}>({LAUNCH_ARGS});\n")
        out.append(f"#else\n#define FC_{F}_FWD_HD_{d}_(X)\n#endif\n\n")
    out.append("// X(D) for every compiled head dim, ascending\n")
    out.append(f"#define FC_{F}_FWD_HEADDIMS(X) " + " ".join(f"FC_{F}_FWD_HD_{d}_(X)" for d in dims) + "\n\n")
    out.append(f"#endif  // FLASHC_CUDA_{F}_INSTANCES_H\n")
    return "".join(out)


def write(path, text):
    if not path.exists() or path.read_text() != text:
        path.write_text(text)
        print(f"wrote {path.relative_to(ROOT)}")


def main():
    for fam in FAMILIES:
        dims = head_dims(fam)
        inst = ROOT / "src" / "cuda" / fam / "inst"
        inst.mkdir(parents=True, exist_ok=True)
        want = set()
        for d in dims:
            for name, ty in DTYPES:
                path = inst / f"fwd_d{d}_{name}.cu"
                want.add(path.name)
                write(path, instance_file(fam, d, ty))
        write(inst / "instances.h", instances_h(fam, dims))
        for stale in inst.glob("fwd_d*.cu"):
            if stale.name not in want:
                stale.unlink()
                print(f"removed {stale.relative_to(ROOT)}")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""gen_instances.py : write the CUDA kernel instances and their dispatch lists.

The head dims come from the one tuning table, src/cuda/traits.h: its
FC_SM80_FWD_TILES rows for the sm80 family, FC_SM90_FWD_TILES for sm90 and
FC_SM90WS_FWD_TILES for sm90ws, so adding a row there and re-running this
script is all a new head dim needs. For each family F, head dim D and dtype it
writes

    src/cuda/F/inst/fwd_d{D}_{bf16,fp16}.cu   the explicit instantiations of
                                             F_fwd_launch<D, T, causal>
                                             for causal = false, true
    src/cuda/F/inst/instances.h              their extern declarations and
                                             FC_F_FWD_HEADDIMS(X), the list
                                             the dispatch switch is built from

and from FC_SM80_BWD_TILES, FC_SM90_BWD_TILES and FC_SM90WS_BWD_TILES in
src/cuda/traits.h the backward's, for F = sm80, sm90, sm90ws:

    src/cuda/F/inst/bwd_d{D}_{bf16,fp16}.cu        F_bwd_launch<D, T, causal>
    src/cuda/F/inst/bwd_instances.h                their extern declarations and
                                                  FC_F_BWD_HEADDIMS(X)

and likewise, from FC_SM80_DECODE_TILES in src/cuda/decode_traits.h, the decode
kernel's instances:

    src/cuda/sm80/inst/decode_d{D}_{bf16,fp16}.cu  sm80_decode_launch<D, T> and
                                                  sm80_decode_ctas_per_sm<D, T>
    src/cuda/sm80/inst/decode_instances.h         their extern declarations and
                                                  FC_SM80_DECODE_HEADDIMS(X)

Every output starts "generated; do not edit". Run from anywhere:
    python3 tools/gen_instances.py           write what differs, remove stale *_d*.cu
    python3 tools/gen_instances.py --check   write nothing; exit 1 naming each file
                                             that is not current (test.sh, CI)
"""
import pathlib
import re
import sys

import generated

ROOT = pathlib.Path(__file__).resolve().parent.parent
TRAITS = ROOT / "src" / "cuda" / "traits.h"
FWD_FAMILIES = ["sm80", "sm90", "sm90ws"]
BWD_FAMILIES = FWD_FAMILIES
INST = ROOT / "src" / "cuda" / "sm80" / "inst"
DTYPES = [("bf16", "__nv_bfloat16"), ("fp16", "__half")]
HEADER = "// generated; do not edit. Written by tools/gen_instances.py from src/cuda/traits.h.\n"
LAUNCH_ARGS = "const fc_cuda_fwd_params &, dim3, cudaStream_t"
# The forward's kernel arguments per family: (header, struct); sm90ws adds TMA descriptors.
FWD_PARAMS = {"sm80": ("params.h", "fc_cuda_fwd_params"), "sm90": ("params.h", "fc_cuda_fwd_params"),
              "sm90ws": ("ws_params.h", "fc_cuda_fwd_ws_params")}


def table_dims(path, table):
    """The head dims (first column) of the X-macro table `table` in `path` (its
    #define ends at a blank line or an #endif)."""
    text = path.read_text()
    m = re.search(rf"#define {table}\(X\)(.*?)\n(\n|#endif)", text, re.S)
    if not m:
        sys.exit(f"{path}: {table}(X) not found")
    dims = [int(d) for d in re.findall(r"X\(\s*(\d+)\s*,", m.group(1))]
    if not dims or dims != sorted(set(dims)):
        sys.exit(f"{path}: head dims must be listed once each, ascending: {dims}")
    return dims


def instance_file(fam, d, ty, dir_="fwd", args=LAUNCH_ARGS):
    lines = [HEADER, f'#include "../{dir_}_kernel.cuh"\n', "\n"]
    for causal in ("false", "true"):
        lines.append(f"template cudaError_t {fam}_{dir_}_launch<{d}, {ty}, {causal}>({args});\n")
    return "".join(lines)


def instances_h(fam, dims, dir_="fwd", args=LAUNCH_ARGS, params=("params.h", "fc_cuda_fwd_params")):
    """The extern declarations of the {fam}_{dir_}_launch instances and the
    FC_{FAM}[_BWD]_..._HEADDIMS(X) list; fwd instances are trimmed by
    FC_{FAM}_HD_<D>, bwd ones by FC_{FAM}_BWD_HD_<D>."""
    F = fam.upper()
    T = F if dir_ == "fwd" else f"{F}_BWD"  # prefix of the trim macros
    guard = f"FLASHC_CUDA_{F}_{'' if dir_ == 'fwd' else 'BWD_'}INSTANCES_H"
    what = "forward" if dir_ == "fwd" else "backward"
    out = [HEADER,
           f"// The {fam} {what} instances that exist, for {'fwd.cu' if dir_ == 'fwd' else 'bwd.cu'}. A build trimmed with\n",
           f"// FLASHC_CUDA_HEADDIMS (or without the family's arch) defines FC_{T}_HD_<D>=0\n",
           "// for the head dims it leaves out.\n",
           f"#ifndef {guard}\n#define {guard}\n\n",
           "#include <cuda_bf16.h>\n#include <cuda_fp16.h>\n#include <cuda_runtime.h>\n\n",
           f'#include "../../{params[0]}"\n\n',
           "template <int D, typename T, bool kCausal>\n",
           f"cudaError_t {fam}_{dir_}_launch(const {params[1]} &p, dim3 grid, cudaStream_t stream);\n\n"]
    lst = "FWD" if dir_ == "fwd" else "BWD"
    for d in dims:
        out.append(f"#ifndef FC_{T}_HD_{d}\n#define FC_{T}_HD_{d} 1\n#endif\n")
        out.append(f"#if FC_{T}_HD_{d}\n#define FC_{F}_{lst}_HD_{d}_(X) X({d})\n")
        for _, ty in DTYPES:
            for causal in ("false", "true"):
                out.append(f"extern template cudaError_t {fam}_{dir_}_launch<{d}, {ty}, {causal}>({args});\n")
        out.append(f"#else\n#define FC_{F}_{lst}_HD_{d}_(X)\n#endif\n\n")
    out.append("// X(D) for every compiled head dim, ascending\n")
    out.append(f"#define FC_{F}_{lst}_HEADDIMS(X) " + " ".join(f"FC_{F}_{lst}_HD_{d}_(X)" for d in dims) + "\n\n")
    out.append(f"#endif  // {guard}\n")
    return "".join(out)


# The backward's kernel arguments per family: (header, struct); sm90ws adds TMA descriptors.
BWD_PARAMS = {"sm80": ("bwd_params.h", "fc_cuda_bwd_params"),
              "sm90": ("bwd_params.h", "fc_cuda_bwd_params"),
              "sm90ws": ("ws_params.h", "fc_cuda_bwd_ws_params")}


DECODE_TRAITS = ROOT / "src" / "cuda" / "decode_traits.h"
DECODE_HEADER = HEADER.replace("src/cuda/traits.h", "src/cuda/decode_traits.h")
DECODE_FUNCS = [("cudaError_t", "sm80_decode_launch", "const fc_cuda_decode_params &, unsigned, cudaStream_t"),
                ("cudaError_t", "sm80_decode_ctas_per_sm", "int *")]


def decode_instance_file(d, ty):
    lines = [DECODE_HEADER, '#include "../decode_kernel.cuh"\n', "\n"]
    for ret, fn, args in DECODE_FUNCS:
        lines.append(f"template {ret} {fn}<{d}, {ty}>({args});\n")
    return "".join(lines)


def decode_instances_h(dims):
    out = [DECODE_HEADER,
           "// The sm80 decode instances that exist, for kvcache.cu. A build trimmed with\n",
           "// FLASHC_CUDA_HEADDIMS defines FC_SM80_DECODE_HD_<D>=0 for the head dims it leaves out.\n",
           "#ifndef FLASHC_CUDA_SM80_DECODE_INSTANCES_H\n#define FLASHC_CUDA_SM80_DECODE_INSTANCES_H\n\n",
           "#include <cuda_bf16.h>\n#include <cuda_fp16.h>\n#include <cuda_runtime.h>\n\n",
           '#include "../../decode_params.h"\n\n']
    for ret, fn, args in DECODE_FUNCS:
        out.append(f"template <int D, typename T>\n{ret} {fn}({args});\n")
    out.append("\n")
    for d in dims:
        out.append(f"#ifndef FC_SM80_DECODE_HD_{d}\n#define FC_SM80_DECODE_HD_{d} 1\n#endif\n")
        out.append(f"#if FC_SM80_DECODE_HD_{d}\n#define FC_SM80_DECODE_HD_{d}_(X) X({d})\n")
        for _, ty in DTYPES:
            for ret, fn, args in DECODE_FUNCS:
                out.append(f"extern template {ret} {fn}<{d}, {ty}>({args});\n")
        out.append(f"#else\n#define FC_SM80_DECODE_HD_{d}_(X)\n#endif\n\n")
    out.append("// X(D) for every compiled decode head dim, ascending\n")
    out.append("#define FC_SM80_DECODE_HEADDIMS(X) " +
               " ".join(f"FC_SM80_DECODE_HD_{d}_(X)" for d in dims) + "\n\n")
    out.append("#endif  // FLASHC_CUDA_SM80_DECODE_INSTANCES_H\n")
    return "".join(out)


def instances(files, stale, inst, prefix, dims, file_text, header, header_text):
    """Into files: inst/{prefix}_d{D}_{dtype}.cu for each head dim and dtype, and
    the header; into stale: every other inst/{prefix}_d*.cu."""
    for d in dims:
        for name, ty in DTYPES:
            files[inst / f"{prefix}_d{d}_{name}.cu"] = file_text(d, ty)
    files[inst / header] = header_text
    stale.extend(sorted(p for p in inst.glob(f"{prefix}_d*.cu") if p not in files))


def generate():
    files, stale = {}, []
    for fam in FWD_FAMILIES:
        dims = table_dims(TRAITS, f"FC_{fam.upper()}_FWD_TILES")
        params = FWD_PARAMS[fam]
        args = f"const {params[1]} &, dim3, cudaStream_t"
        instances(files, stale, ROOT / "src" / "cuda" / fam / "inst", "fwd", dims,
                  lambda d, ty, fam=fam, args=args: instance_file(fam, d, ty, args=args),
                  "instances.h", instances_h(fam, dims, args=args, params=params))
    for fam in BWD_FAMILIES:
        dims = table_dims(TRAITS, f"FC_{fam.upper()}_BWD_TILES")
        params = BWD_PARAMS[fam]
        args = f"const {params[1]} &, dim3, cudaStream_t"
        instances(files, stale, ROOT / "src" / "cuda" / fam / "inst", "bwd", dims,
                  lambda d, ty, fam=fam, args=args: instance_file(fam, d, ty, "bwd", args),
                  "bwd_instances.h", instances_h(fam, dims, "bwd", args, params))
    dims = table_dims(DECODE_TRAITS, "FC_SM80_DECODE_TILES")
    instances(files, stale, INST, "decode", dims, decode_instance_file, "decode_instances.h",
              decode_instances_h(dims))
    return files, stale


if __name__ == "__main__":
    generated.main(__doc__, generate)

"""flashc._lib : the one ctypes binding of libflashc.so (include/flashc.h).

It holds the C structs as ctypes declarations, finds and loads the library, turns a
torch tensor into a flashc_tensor description, and runs one entry point (on CUDA with
the workspace it asks for, allocated by torch; on the CPU with the library's own),
raising FlashcError with the library's message on failure.
It knows nothing of flash_attn's API (interface.py) and never touches torch's C++
ABI: only data pointers, shapes and strides cross into C.

The library is found, in this order: the path in $FLASHC_LIBRARY; libflashc.so
installed next to this file (by `pip install .`); build/libflashc.so of the source
tree this package sits in (python/flashc -> ../../build), for PYTHONPATH=python.
It must have this package's ABI version and be its release (VERSION), or
ImportError says which it is; $FLASHC_ALLOW_VERSION_MISMATCH=1 lets another
release of the same ABI version through.
"""
import ctypes
import os

import torch

# ---- the C API (include/flashc.h), field for field ----
MAX_DIMS = 4
WORKSPACE_ALIGN = 256

STATUS_NAMES = ("FLASHC_OK", "FLASHC_ERR_INVALID_ARG", "FLASHC_ERR_UNSUPPORTED",
                "FLASHC_ERR_WORKSPACE_TOO_SMALL", "FLASHC_ERR_OUT_OF_MEMORY", "FLASHC_ERR_CUDA",
                "FLASHC_ERR_INTERNAL")
OK, ERR_INVALID_ARG, ERR_UNSUPPORTED = 0, 1, 2

DTYPES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2, torch.int32: 3}
DEVICES = {"cpu": 0, "cuda": 1}
BACKEND_AUTO, BACKEND_CPU, BACKEND_CUDA = 0, 1, 2


class Tensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("dtype", ctypes.c_int), ("ndim", ctypes.c_int32),
                ("shape", ctypes.c_int64 * MAX_DIMS), ("stride", ctypes.c_int64 * MAX_DIMS),
                ("device", ctypes.c_int)]


# FLASHC_ABI_VERSION of the flashc.h these structs mirror: the library rejects args
# of any other version, and _load refuses a library of another one.
ABI_VERSION = 4
# The flashc release this package is (flashc.h's FLASHC_VERSION_*, which setup.py
# gives the wheel with a build label: 0.4.0+cpu): _load refuses a library of another
# release unless $FLASHC_ALLOW_VERSION_MISMATCH is 1.
VERSION = "0.4.0"


class Params(ctypes.Structure):
    _fields_ = [("softmax_scale", ctypes.c_float), ("scale_given", ctypes.c_int32),
                ("causal", ctypes.c_int32), ("windowed", ctypes.c_int32),
                ("window_left", ctypes.c_int32), ("window_right", ctypes.c_int32),
                ("softcap", ctypes.c_float), ("dropout_p", ctypes.c_float),
                ("dropout_seed", ctypes.c_uint64), ("dropout_offset", ctypes.c_uint64),
                ("deterministic", ctypes.c_int32), ("rotary_halves", ctypes.c_int32),
                ("num_splits", ctypes.c_int32), ("backend", ctypes.c_int),
                ("stream", ctypes.c_void_p)]


class _Args(ctypes.Structure):
    """An args struct: abi set to ABI_VERSION, every tensor absent."""

    def __init__(self):
        super().__init__()
        self.abi = ABI_VERSION


def _args_struct(name, fields):
    """An args struct: abi, then flashc_tensor fields, with int64 fields where named so."""
    ints = ("max_seqlen_q", "max_seqlen_k")
    return type(name, (_Args,),
                {"_fields_": [("abi", ctypes.c_uint32)] +
                             [(f, ctypes.c_int64 if f in ints else Tensor) for f in fields]})


FwdArgs = _args_struct("FwdArgs", ("q", "k", "v", "out", "softmax_lse", "alibi_slopes",
                                   "attn_probs", "sink"))
VarlenFwdArgs = _args_struct("VarlenFwdArgs", (
    "q", "k", "v", "out", "cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q", "max_seqlen_k",
    "seqused_k", "block_table", "softmax_lse", "alibi_slopes", "attn_probs", "sink"))
BwdArgs = _args_struct("BwdArgs", ("dout", "q", "k", "v", "out", "softmax_lse", "dq", "dk",
                                   "dv", "alibi_slopes", "sink", "dsink"))
VarlenBwdArgs = _args_struct("VarlenBwdArgs", (
    "dout", "q", "k", "v", "out", "softmax_lse", "dq", "dk", "dv", "cu_seqlens_q",
    "cu_seqlens_k", "max_seqlen_q", "max_seqlen_k", "alibi_slopes", "sink", "dsink"))
KvcacheArgs = _args_struct("KvcacheArgs", (
    "q", "k_cache", "v_cache", "k_new", "v_new", "rotary_cos", "rotary_sin", "cache_seqlens",
    "cache_batch_idx", "cache_leftpad", "block_table", "alibi_slopes", "out", "softmax_lse",
    "sink"))

# the integer metadata tensors (int32 only)
INT_ARGS = frozenset(("cu_seqlens_q", "cu_seqlens_k", "seqused_k", "block_table",
                      "cache_seqlens", "cache_batch_idx", "cache_leftpad"))

# entry point -> its args struct (each has a *_workspace_size twin)
ENTRY_POINTS = {"flashc_fwd": FwdArgs, "flashc_varlen_fwd": VarlenFwdArgs,
                "flashc_bwd": BwdArgs, "flashc_varlen_bwd": VarlenBwdArgs,
                "flashc_fwd_kvcache": KvcacheArgs}


class FlashcError(RuntimeError):
    """A flashc call failed. .status is the flashc_status value, .status_name its name;
    the message is flashc_last_error(), which names the argument and its values."""

    def __init__(self, status, message):
        self.status = status
        self.status_name = STATUS_NAMES[status] if 0 <= status < len(STATUS_NAMES) else str(status)
        super().__init__("%s: %s" % (self.status_name, message))


class FlashcArgumentError(FlashcError, ValueError):
    """FLASHC_ERR_INVALID_ARG, or an argument the Python layer rejects before the call."""


def raise_for(status, message):
    cls = FlashcArgumentError if status == ERR_INVALID_ARG else FlashcError
    raise cls(status, message)


# ---- loading ----
def _candidates():
    env = os.environ.get("FLASHC_LIBRARY")
    if env:
        return [env]
    here = os.path.dirname(os.path.abspath(__file__))
    return [os.path.join(here, "libflashc.so"),
            os.path.join(here, os.pardir, os.pardir, "build", "libflashc.so")]


def _load():
    tried = []
    for path in _candidates():
        if os.path.exists(path):
            lib = ctypes.CDLL(os.path.abspath(path))
            break
        tried.append(path)
    else:
        raise ImportError("flashc: libflashc.so not found (tried %s); build it with "
                          "`cmake -S . -B build && cmake --build build` and set FLASHC_LIBRARY "
                          "to its path, or `pip install .` from the source tree" % ", ".join(tried))
    pstatus = ctypes.POINTER(ctypes.c_size_t)
    for name, args in ENTRY_POINTS.items():
        pa, pp = ctypes.POINTER(args), ctypes.POINTER(Params)
        getattr(lib, name).restype = ctypes.c_int
        getattr(lib, name).argtypes = [pa, pp, ctypes.c_void_p, ctypes.c_size_t]
        getattr(lib, name + "_workspace_size").restype = ctypes.c_int
        getattr(lib, name + "_workspace_size").argtypes = [pa, pp, pstatus]
    lib.flashc_last_error.restype = ctypes.c_char_p
    lib.flashc_version.restype = ctypes.c_char_p
    lib.flashc_params_default.restype = Params
    lib.flashc_backend_available.restype = ctypes.c_int
    lib.flashc_backend_available.argtypes = [ctypes.c_int]
    lib.flashc_version_number.restype = ctypes.c_uint
    abi = None
    if hasattr(lib, "flashc_abi_version"):
        lib.flashc_abi_version.restype = ctypes.c_uint
        abi = lib.flashc_abi_version()
    refusal = _refusal(path, lib.flashc_version().decode(), abi,
                       os.environ.get("FLASHC_ALLOW_VERSION_MISMATCH") == "1")
    if refusal:
        raise ImportError(refusal)
    return lib


def _refusal(path, version, abi, allow_mismatch):
    """Why this package must not use the library at `path` (libflashc `version`, ABI
    version `abi`, None before flashc 0.3), or None. Another ABI version is always
    refused (the structs above would be misread); another release only unless
    allow_mismatch ($FLASHC_ALLOW_VERSION_MISMATCH=1)."""
    if abi != ABI_VERSION:
        return ("flashc: %s is libflashc %s with ABI version %s, but this package needs ABI "
                "version %d: rebuild the library from this package's source tree" %
                (path, version, "unknown (before 0.3)" if abi is None else abi, ABI_VERSION))
    if version != VERSION and not allow_mismatch:
        return ("flashc: %s is libflashc %s, but this package is flashc %s: rebuild the "
                "library from this package's source tree, or set "
                "FLASHC_ALLOW_VERSION_MISMATCH=1 to use it anyway" % (path, version, VERSION))
    return None


lib = _load()
# entry point -> (its function, its *_workspace_size), looked up once
ENTRY_FUNCTIONS = {name: (getattr(lib, name), getattr(lib, name + "_workspace_size"))
                   for name in ENTRY_POINTS}


# _fastcall.c's module as CMake and `pip install .` name it (the stable ABI's suffix),
# and the protocol (its FC_PROTOCOL: setup's arguments, the key's and the entry's
# layout) this package speaks
FASTCALL_FILE = "_fastcall.abi3.so"
FASTCALL_PROTOCOL = 2


def _load_fastcall():
    """flashc._fastcall (_fastcall.c: the prepared calls of interface.py in C) from the
    folder the library was loaded from, where `pip install .` and a CMake build put it
    beside libflashc.so; None where there is none, where it does not load, or where it
    speaks another protocol (another checkout's), and interface.py runs the prepared
    calls in Python. $FLASHC_FASTCALL=0 leaves it out; =1 requires it (ImportError
    without it), as ./test.sh does."""
    want = os.environ.get("FLASHC_FASTCALL", "")
    if want == "0":
        return None
    path = os.path.join(os.path.dirname(lib._name), FASTCALL_FILE)
    why = "%s is missing: build it with the library (CMake finds Python's headers: the " \
          "python3-dev package)" % path
    if os.path.exists(path):
        import importlib.machinery
        import importlib.util
        try:
            loader = importlib.machinery.ExtensionFileLoader("flashc._fastcall", path)
            spec = importlib.util.spec_from_file_location("flashc._fastcall", path,
                                                          loader=loader)
            module = importlib.util.module_from_spec(spec)
            loader.exec_module(module)
        except (ImportError, OSError) as e:
            why = "%s does not load: %s" % (path, e)
        else:
            protocol = getattr(module, "PROTOCOL", None)
            if protocol == FASTCALL_PROTOCOL:
                return module
            why = "%s speaks protocol %s, this package %d: rebuild it from this package's " \
                  "source tree" % (path, protocol, FASTCALL_PROTOCOL)
    if want == "1":
        raise ImportError("flashc: FLASHC_FASTCALL=1 but " + why)
    return None


fastcall = _load_fastcall()


def version():
    """The linked library's "MAJOR.MINOR.PATCH"."""
    return lib.flashc_version().decode()


def fail(entry, status, rename):
    """Raise the error of entry point `entry`'s failed call (status), with the library's
    message (this thread's flashc_last_error), its C argument names mapped to the caller's
    by `rename`."""
    message = lib.flashc_last_error().decode()
    for c_name, py_name in (rename or {}).items():
        message = message.replace(c_name, py_name)
    raise_for(status, "%s: %s" % (entry, message))


def address(entry):
    """The addresses of entry point `entry` and of its size query, for _fastcall."""
    return tuple(ctypes.cast(f, ctypes.c_void_p).value for f in ENTRY_FUNCTIONS[entry])


# ---- tensors and calls ----
def describe(t, name):
    """The flashc_tensor view of torch tensor t (absent when t is None). Strides are
    passed as they are; the library checks them and names `name` when it rejects one."""
    d = Tensor()
    if t is not None:
        describe_into(d, t, name)
    return d


def describe_into(d, t, name):
    """Fill flashc_tensor d (a field of an args struct, written in place) with the view of
    torch tensor t; as describe()."""
    # each attribute read once (t.device builds an object: 0.3 us), arrays filled by
    # slices: a decode call describes five or six tensors, and this was half of the
    # Python time of its work
    dt, n = t.dtype, t.dim()
    device = DEVICES["cuda"] if t.is_cuda else DEVICES["cpu"] if t.is_cpu else None
    if name in INT_ARGS and dt != torch.int32:
        raise FlashcArgumentError(ERR_INVALID_ARG, "%s.dtype=%s but must be torch.int32" %
                                  (name, dt))
    if dt not in DTYPES:
        raise FlashcArgumentError(ERR_INVALID_ARG, "%s.dtype=%s but flashc takes float32, "
                                  "float16, bfloat16 or int32" % (name, dt))
    if device is None:
        raise FlashcArgumentError(ERR_INVALID_ARG, "%s.device=%s but flashc runs on cpu or "
                                  "cuda tensors" % (name, t.device))
    if n > MAX_DIMS:
        raise FlashcArgumentError(ERR_INVALID_ARG, "%s.dim()=%d but flashc takes at most %d" %
                                  (name, n, MAX_DIMS))
    d.data = t.data_ptr()
    d.dtype = DTYPES[dt]
    d.ndim = n
    d.shape[:n] = t.shape
    d.stride[:n] = t.stride()
    d.device = device


# torch's current stream of a device as its raw handle, without building a Stream object
# (torch's private _cuda_getCurrentRawStream, what its own kernel launchers call; the
# public path where a torch lacks it)
_RAW_STREAM = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def stream(device):
    """The raw handle of torch's current stream on CUDA device `device`."""
    index = torch.cuda.current_device() if device.index is None else device.index
    return (_RAW_STREAM(index) if _RAW_STREAM is not None else
            torch.cuda.current_stream(index).cuda_stream)


def params(device, **fields):
    """flashc_params_default() (all zeros, include/flashc.h) with `fields` set; the CUDA
    stream is torch's current one."""
    p = Params(**fields)
    if device.type == "cuda":
        p.stream = stream(device)
    return p


def call(entry, args, p, device, rename=None):
    """Run entry point `entry`. On CUDA with a workspace of the size it asks for,
    allocated by torch on `device` (stream-ordered, where the library's own allocator,
    cudaMalloc, would synchronise) and aligned to 256 bytes; on the CPU with workspace
    NULL, the library's convenience path: it sizes and borrows the workspace itself,
    one C call instead of two. `rename` maps the C argument names in an error message
    to the caller's."""
    fn, size_fn = ENTRY_FUNCTIONS[entry]
    status, ptr, size = OK, None, 0
    if device.type == "cuda":
        nbytes = ctypes.c_size_t(0)
        status = size_fn(ctypes.byref(args), ctypes.byref(p), ctypes.byref(nbytes))
        size = nbytes.value
        if status == OK and size:
            ws = torch.empty(size + WORKSPACE_ALIGN, dtype=torch.uint8, device=device)
            ptr = (ws.data_ptr() + WORKSPACE_ALIGN - 1) // WORKSPACE_ALIGN * WORKSPACE_ALIGN
    if status == OK:
        status = fn(ctypes.byref(args), ctypes.byref(p), ptr, size)
    if status != OK:
        fail(entry, status, rename)
    # On CUDA, freeing ws now is safe: torch's caching allocator reuses it only for
    # work ordered after this op on the same stream.

"""flash_attn, made of flashc: `import flash_attn` for code written against flash_attn 2.x
that is not to be edited. This folder's parent (python/flash_attn_shim) is on no path
unless you put it there, so a real flash_attn install is never shadowed by default:

    PYTHONPATH=python:python/flash_attn_shim python3 train.py

Then flash_attn, flash_attn.flash_attn_interface, flash_attn.bert_padding and
flash_attn.layers.rotary hold flashc's functions under flash_attn's names (each module
re-exports its flashc twin's __all__). __version__ is the flash_attn release whose API
flashc follows, so that version checks in callers choose the 2.7+ signatures; flashc's
own version is flashc.__version__. The folder next to this one,
flash_attn-<__version__>.dist-info, says the same to importlib.metadata (version() and
packages_distributions(), which HF transformers reads to decide that flash_attn is
present); keep its name and its METADATA's Version equal to __version__.
"""
from flashc import *  # noqa: F401,F403  the seven functions, apply_rotary_emb, the errors

from . import flash_attn_interface  # noqa: F401  as flash_attn's __init__ loads it

__version__ = "2.8.3"

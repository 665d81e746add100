"""flash_attn_interface, made of flashc: FlashAttention-3's top-level module, the one its
hopper/setup.py installs next to the flash_attn_3 package (py_modules=
["flash_attn_interface"]), holding flashc.v3's names: flash_attn_func,
flash_attn_qkvpacked_func, flash_attn_varlen_func, flash_attn_with_kvcache,
flash_attn_combine, get_scheduler_metadata and the private _flash_attn_forward,
_flash_attn_backward. `from flash_attn_interface import flash_attn_func` is how FA3's
README and HF transformers (attn_implementation="flash_attention_3") import it. Not
flash_attn.flash_attn_interface (flash_attn 2.x's names, the folder flash_attn/ next to
this file). On no path unless python/flash_attn_shim is put there.
"""
from flashc.v3 import *  # noqa: F401,F403
from flashc.v3 import __all__  # noqa: F401

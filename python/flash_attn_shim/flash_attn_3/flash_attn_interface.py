"""flash_attn_3.flash_attn_interface, made of flashc: flashc.v3's names, the private ops
_flash_attn_forward and _flash_attn_backward included (FA3's module of this name
re-exports its top-level flash_attn_interface and those two, for Transformer Engine)."""
from flashc.v3 import *  # noqa: F401,F403
from flashc.v3 import __all__  # noqa: F401

"""flash_attn.flash_attn_interface, made of flashc: flashc.flash_attn_interface's names,
the private ops (_flash_attn_forward, ...) included."""
from flashc.flash_attn_interface import *  # noqa: F401,F403
from flashc.flash_attn_interface import __all__  # noqa: F401

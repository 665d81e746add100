"""flash_attn.layers.rotary, made of flashc: flashc.layers.rotary's names."""
from flashc.layers.rotary import *  # noqa: F401,F403
from flashc.layers.rotary import __all__  # noqa: F401

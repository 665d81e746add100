"""flash_attn_2_cuda, the compiled module flash_attn 2.x installs, made of flashc:
flashc.flash_attn_2_cuda's fwd, varlen_fwd, bwd, varlen_bwd and fwd_kvcache, as
Transformer Engine imports varlen_bwd from it."""
from flashc.flash_attn_2_cuda import *  # noqa: F401,F403
from flashc.flash_attn_2_cuda import __all__  # noqa: F401

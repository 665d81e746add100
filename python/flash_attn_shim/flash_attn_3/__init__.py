"""flash_attn_3, made of flashc: the package of FlashAttention-3's distribution
(flash_attn_3 3.0.0, Dao-AILab/flash-attention hopper/), for code that finds FA3 by it:
Transformer Engine imports flash_attn_3.flash_attn_interface once
importlib.metadata.version("flash-attn-3") answers, and HF transformers'
is_flash_attn_3_available asks importlib.util.find_spec("flash_attn_3") (its 4.5x and
early 5.x releases; later ones ask for flash_attn_interface, the module next to this
folder). As in FA3, the package itself holds only __version__; its functions are in
flash_attn_3.flash_attn_interface, flashc.v3's names.

__version__ is the FA3 release whose API flashc.v3 follows: 3.0.0, the version of the
flash_attn_3 wheels on PyTorch's package index and the one FA3's own
flash_attn_3/__init__.py (commit 01afd16) falls back to; flashc's own version is
flashc.__version__. The folder flash_attn_3-<__version__>.dist-info next to this one says
the same to importlib.metadata; keep its name and its METADATA's Version equal to
__version__.
"""
__version__ = "3.0.0"

"""flash_attn.layers, made of flashc: the rotary module (flashc.layers)."""
